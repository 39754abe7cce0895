"""The languages an `hf` card declares, guessed from the rows' letters by Unicode script.

A heuristic, and the card says so: each script stands for one language (Latin for English,
Cyrillic for Russian, Han without kana for Chinese, ...), so French or Ukrainian rows are
declared as English or Russian. `--language` replaces the guess, with the codes the Hub takes
(`is_language_code`: ISO 639-1, 639-2/3, `code`; `CardOptions.check` refuses any other). Written here because no language
detector is in the lock, and a script is one code point range test.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

DETECTION_NOTE = (
    "Guessed from the rows' letters by script, one language per script (Latin: en, Cyrillic: "
    "ru, Han: zh, kana: ja, Hangul: ko, ...); export with --language to declare them."
)

# The ISO 639-1 codes (two letters) a card's `language` may hold (`--language`): those the Hub
# lists (its languages, as the `datasets` package's `languages.json` mirrors them), withdrawn
# `bh` and `sh` included; the Hub knows no value outside it as a language.
_ISO_639_1_CODES = (
    "aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co cr cs cu "
    "cv cy da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi "
    "ho hr ht hu hy hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks "
    "ku kv kw ky la lb lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl "
    "nn no nr nv ny oc oj om or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg sh si sk "
    "sl sm sn so sq sr ss st su sv sw ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz "
    "ve vi vo wa wo xh yi yo za zh zu"
)
ISO_639_1 = frozenset(_ISO_639_1_CODES.split())
# The Hub's other values: its special ones, and ISO 639-2/3's three-letter codes (some 7,800;
# their shape is checked, not each code: `yue`, `fil`, `ceb` are languages of the Hub too).
_SPECIAL_CODES = frozenset({"code", "multilingual"})
_THREE_LETTERS = re.compile(r"[a-z]{3}")


def is_language_code(code: str) -> bool:
    """Whether a card's `language` may hold `code` (lower case): an ISO 639-1 code the Hub
    lists, an ISO 639-2/3 one, or one of its special values."""
    return code in ISO_639_1 or code in _SPECIAL_CODES or bool(_THREE_LETTERS.fullmatch(code))


# (first, last code point, ISO 639-1 code), the scripts a language is guessed from.
_SCRIPTS = (
    (0x0041, 0x024F, "en"),  # Latin (basic, Latin-1, extended A/B)
    (0x0370, 0x03FF, "el"),
    (0x0400, 0x04FF, "ru"),
    (0x0590, 0x05FF, "he"),
    (0x0600, 0x06FF, "ar"),
    (0x0900, 0x097F, "hi"),
    (0x0E00, 0x0E7F, "th"),
    (0x3040, 0x30FF, "ja"),  # hiragana and katakana
    (0x4E00, 0x9FFF, "zh"),  # CJK unified ideographs (Japanese too: see `languages`)
    (0xAC00, 0xD7AF, "ko"),
)
# A language whose share of the letters is below this is a quotation, not the rows' language.
_MIN_SHARE = 0.05


def _script(char: str) -> str | None:
    point = ord(char)
    for first, last, code in _SCRIPTS:
        if first <= point <= last:
            return code if char.isalpha() else None
    return None


class ScriptCounter:
    """Letters by script over every text it is fed."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def add(self, texts: Iterable[str]) -> None:
        for text in texts:
            self._counts.update(code for code in map(_script, text) if code is not None)

    def languages(self) -> list[str]:
        """The languages with at least 5% of the letters, most letters first; Han counts as
        Japanese when kana are there."""
        counts = Counter(self._counts)
        if counts["ja"] and counts["zh"]:
            counts["ja"] += counts.pop("zh")
        total = sum(counts.values())
        return [
            code
            for code, count in counts.most_common()
            if count and total and count / total >= _MIN_SHARE
        ]
