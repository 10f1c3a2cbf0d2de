"""Canonical text for the guard: how a destination written to fool a reader is read back.

An attacker writes an address so that a person (or a filter) misses it and a model rewrites it:
full-width or other compatibility characters (U+FF15 for `5`), look-alike letters from other
scripts (Cyrillic U+0435 for `e`, Greek U+03BF for `o`), invisible characters inside it (zero-
width spaces, soft hyphens), digits spelled as words ("five five five, zero one nine nine").
`canonical(text)` undoes all of these: Unicode compatibility normalisation (NFKC), invisible
characters dropped, the confusable letters of Cyrillic and Greek mapped to the Latin ones they
imitate (a skeleton, after Unicode's confusables idea, limited to the letters that imitate
ASCII), and runs of at least three spelled digits written as digits. The guard scans content and
tool text in this form, so what a destination *looks like* is what it is; trust never comes from
it (a look-alike of what the user said is not what the user said).
"""

from __future__ import annotations

import functools
import re
import unicodedata

__all__ = ["canonical", "skeleton"]

_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e"), None)
# Cyrillic and Greek letters that imitate Latin ones (lower and upper case).
_CONFUSABLE = str.maketrans(  # the look-alikes are the point
    "аеорсуххіјԁһкмтвнзӏАВЕКМНОРСТХУІЈαβεικνορτυχωΑΒΕΗΙΚΜΝΟΡΤΥΧΖ",
    "aeopcyxxijdhkmtbh3lABEKMHOPCTXYIJabeikvoptuxwABEHIKMNOPTYXZ",
)
_DIGIT_WORDS = {
    "zero": "0",
    "oh": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
}
_SPELLED = re.compile(
    r"\b(?:" + "|".join(_DIGIT_WORDS) + r")(?:[\s,.-]+(?:" + "|".join(_DIGIT_WORDS) + r"))+\b",
    re.I,
)


def skeleton(text: str) -> str:
    """`text` with compatibility forms normalised, invisible characters dropped and look-alike
    letters mapped to the Latin ones they imitate."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", text).translate(_INVISIBLE).translate(_CONFUSABLE)


@functools.lru_cache(maxsize=8192)
def canonical(text: str) -> str:
    """`skeleton(text)` with runs of three or more spelled digits written as digits."""
    text = skeleton(text)
    if not _SPELLED.search(text):
        return text

    def digits(match: re.Match[str]) -> str:
        spoken = re.split(r"[\s,.-]+", match.group(0).lower())
        if len(spoken) < 3:
            return match.group(0)
        return "".join(_DIGIT_WORDS[w] for w in spoken)

    return _SPELLED.sub(digits, text)
