"""The texts duplicates and benchmark overlap are judged on, and their tokens.

`normalize_text` is the exact-duplicate key: it folds only what carries no meaning, case and
whitespace (and Unicode's canonically equivalent encodings of one character), so "2+2" and "2-2",
"3 < 2" and "3 > 2", "C#" and "C++" stay apart; a prompt of symbols only keeps its symbols.
`loose_text` is for comparisons that should survive re-punctuation (a benchmark item quoted with
other quotes, a model echoing its instruction): compatibility forms folded too, punctuation and
symbols dropped, as lm-eval's decontamination does.

`text_tokens` cuts a text into the units n-grams and shingles are made of: whitespace words, except
that every character of a script written without spaces (Chinese, Japanese kana, Thai, Lao, Khmer,
Myanmar, Tibetan) is a token of its own, as multilingual dedup tools (text-dedup, CCNet) screen
those scripts by character n-grams; Russian or Korean, written with spaces, keep word n-grams.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

# Code point ranges of the scripts written without spaces between words.
_UNSPACED = (
    "\u0e00-\u0eff"  # Thai, Lao
    "\u0f00-\u0fff"  # Tibetan
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff"  # Khmer
    "\u2e80-\u2fdf"  # CJK and Kangxi radicals
    "\u3005-\u3007\u3021-\u3029\u3038-\u303b"  # iteration and closing marks, ideographic zero, Hangzhou numerals
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3100-\u312f\u31a0-\u31bf"  # Bopomofo
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf\u4e00-\u9fff"  # CJK ideographs (extension A, unified)
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff66-\uff9f"  # halfwidth Katakana
    "\U00020000-\U000323af"  # CJK ideographs, extensions B to I (H: Unicode 15)
)
_TOKEN = re.compile(rf"[{_UNSPACED}]|[^\s{_UNSPACED}]+")
_WHITESPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """The exact-duplicate key's text: canonical Unicode, casefolded, whitespace collapsed.

    NFC, not NFKC: compatibility folding would make "x²" the same as "x2" and "①" as "1", a
    difference of meaning in math data. Casefolded from the decomposed form, as Unicode's
    canonical caseless match (D145) does: the iota subscript (U+0345) reorders, so a composed
    Greek capital and its small letter folded apart. NFC after, the key's compact form.
    """
    folded = unicodedata.normalize("NFC", unicodedata.normalize("NFD", text).casefold())
    return _WHITESPACE.sub(" ", folded).strip()


# Punctuation (P*), symbols (S*) and format characters (Cf).
_LOOSE_DROPPED = frozenset({"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Cf"})


def loose_text(text: str) -> str:
    """Casefolded text without punctuation or symbols (compatibility forms folded), whitespace
    collapsed: for overlap that should survive other quoting, never for the exact key."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    # Invisible format characters (Cf: a soft hyphen, a zero-width space, as text pasted from
    # the web carries) go too: a quoted copy is a copy with them.
    kept = "".join(ch for ch in folded if unicodedata.category(ch) not in _LOOSE_DROPPED)
    return _WHITESPACE.sub(" ", kept).strip()


def text_tokens(text: str) -> list[str]:
    """Whitespace words, each character of a script without spaces a token of its own."""
    return _TOKEN.findall(text)


def token_ngrams(text: str, n: int) -> Iterator[str]:
    """The token n-grams of `text`, space-joined (none when it has fewer than `n` tokens)."""
    tokens = text_tokens(text)
    for start in range(len(tokens) - n + 1):
        yield " ".join(tokens[start : start + n])
