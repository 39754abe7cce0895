"""The duplicate key and the tokens n-grams are made of, on hostile text: every script, control
characters, combining marks, odd whitespace (hypothesis), and the cases the issue named."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from kimi_batch.quality.dedup_index import loose_text, normalize_text, text_tokens, token_ngrams

# Characters the generic strategy rarely draws: scripts with and without spaces, combining marks,
# joiners, controls, symbols and operators, odd spaces.
SAMPLES = (
    "aZ09+-*/<>=!?#.,;:'\"()[]{}%$€£¥^~|&@_`\\"
    "дЖяЁ"  # Cyrillic
    "αΩςΣ"  # Greek, final sigma
    "你好漢字東京タワーはひらがなカタカナ。、「」"  # Chinese, Japanese
    "ภาษาไทย"  # Thai
    "한국어"  # Hangul
    "العربية"  # Arabic
    "हिन्दी"  # Devanagari
    "\u0301\u0308\u0327\u3099"  # combining marks
    "\u200b\u200c\u200d\u2060\ufeff"  # zero-width characters, joiners
    "\x00\x01\x07\x1b\x7f\x85"  # controls
    "\t\n\r\x0b\x0c \xa0\u2003\u3000"  # whitespace
    "²½①ﬁＡ１"  # compatibility forms
    "😀👍🏽"
)
CHARACTERS = st.one_of(st.characters(exclude_categories=["Cs"]), st.sampled_from(SAMPLES))
TEXTS = st.text(CHARACTERS, max_size=40)
WHITESPACE = st.text(st.sampled_from("\t\n\r\x0b\x0c \xa0\u2003\u3000"), min_size=1, max_size=3)


def _fold(character: str) -> str:
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", character).casefold())


def _case_stable(character: str) -> bool:
    """Upper-casing it is a case variant (not, say, the dotless i U+0131 becoming I, another letter)."""
    return _fold(character.upper()) == _fold(character) == _fold(character.lower())


def test_the_issue_s_prompts_have_different_keys() -> None:
    pairs = [
        ("What is 2-2?", "What is 2+2?"),
        ("What is 2*2?", "What is 2+2?"),
        ("What is 22?", "What is 2+2?"),
        ("Is 3 < 2?", "Is 3 > 2?"),
        ("Explain C# templates", "Explain C++ templates"),
        ("+-*/", "<>=!"),
        ("x²", "x2"),
    ]
    for one, other in pairs:
        assert normalize_text(one) != normalize_text(other), (one, other)
    assert normalize_text("!!!") == "!!!"  # symbols only: kept, not ""


@settings(max_examples=1000, deadline=None)
@given(st.data(), TEXTS.filter(bool))
def test_a_different_meaning_bearing_character_never_shares_the_key(
    data: st.DataObject, text: str
) -> None:
    position = data.draw(st.integers(0, len(text) - 1))
    replaced = text[position]
    other = data.draw(CHARACTERS.filter(lambda c: not c.isspace() and _fold(c) != _fold(replaced)))
    changed = text[:position] + other + text[position + 1 :]
    assert normalize_text(changed) != normalize_text(text)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.text(CHARACTERS.filter(lambda c: not c.isspace() and _case_stable(c)), min_size=1)),
    st.data(),
)
def test_case_and_whitespace_variants_share_the_key(words: list[str], data: st.DataObject) -> None:
    text = " ".join(words)
    gaps = [data.draw(WHITESPACE) for _ in range(len(words) + 1)]
    respaced = gaps[0] + "".join(word + gap for word, gap in zip(words, gaps[1:], strict=True))
    key = normalize_text(text)
    assert normalize_text(respaced) == key
    assert normalize_text(text.upper()) == key
    assert normalize_text(text.lower()) == key
    assert normalize_text(respaced.swapcase()) == key


@settings(max_examples=1000, deadline=None)
@given(TEXTS)
def test_the_key_is_a_fixed_point_and_has_no_edge_or_double_whitespace(text: str) -> None:
    key = normalize_text(text)
    assert normalize_text(key) == key
    assert key == key.strip()
    assert not any(a.isspace() and b.isspace() for a, b in itertools.pairwise(key))
    # The tokens cover every non-space character of the text, in order.
    assert "".join(text_tokens(key)) == "".join(key.split())


def _random_text(chooser: random.Random) -> str:
    def character() -> str:
        if chooser.random() < 0.5:
            return chooser.choice(SAMPLES)
        code = chooser.randrange(0x110000)
        return chr(code) if not 0xD800 <= code < 0xE000 else "?"

    return "".join(character() for _ in range(chooser.randrange(40)))


def test_the_key_is_the_same_in_another_process() -> None:
    """No hash seed, locale or process state in the key: another interpreter, with another hash
    seed and the C locale, makes the same keys of 500 random texts."""
    chooser = random.Random(42)
    texts = [_random_text(chooser) for _ in range(500)]
    script = (
        "import json, sys\n"
        "from kimi_batch.quality.dedup_index import normalize_text\n"
        "texts = json.loads(sys.stdin.read())\n"
        "print(json.dumps([normalize_text(t) for t in texts]))\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "LC_ALL": "C", "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert json.loads(child.stdout) == [normalize_text(text) for text in texts]


def test_scripts_without_spaces_are_cut_into_characters_others_into_words() -> None:
    assert text_tokens("東京タワーは高い") == ["東", "京", "タ", "ワ", "ー", "は", "高", "い"]
    assert text_tokens("สวัสดีครับ") == list("สวัสดีครับ")
    assert text_tokens("Москва — столица России") == ["Москва", "—", "столица", "России"]
    assert text_tokens("한국어 문장입니다") == ["한국어", "문장입니다"]  # Korean has spaces
    assert text_tokens("Tokyo東京tower") == ["Tokyo", "東", "京", "tower"]
    assert list(token_ngrams("東京タワー", 3)) == ["東 京 タ", "京 タ ワ", "タ ワ ー"]
    # CJK extension H (Unicode 15, past G's last code point U+3134F) too.
    assert text_tokens("\U00031350\U00031351\U000323af") == [
        "\U00031350",
        "\U00031351",
        "\U000323af",
    ]


def test_the_key_is_unicode_s_canonical_caseless_match() -> None:
    """Casefolding the composed form split a Greek word from its capitalized form: the iota
    subscript (U+0345) reorders on decomposition (Unicode D145 folds the decomposed form)."""
    assert normalize_text("\u1fb7") == normalize_text("\u1fbc\u0342")  # ᾷ and ᾼ͂
    assert normalize_text("\u1f80") == normalize_text("\u1f88")  # ᾀ and ᾈ


def test_the_loose_text_drops_punctuation_symbols_and_invisible_format_characters() -> None:
    assert loose_text("  Hello, WORLD!  «Quoted» 2+2 ") == "hello world quoted 22"
    assert loose_text("東京、タワー。") == "東京タワー"
    assert loose_text("\uff26\uff55\uff4c\uff4c \uff57\uff49\uff44\uff54\uff48") == "full width"
    # Invisible format characters, as text pasted from the web carries: soft hyphen, ZWSP, BOM.
    assert loose_text("con\u00adtami\u00adnated zero\u200bwidth \ufeffmark") == (
        "contaminated zerowidth mark"
    )
