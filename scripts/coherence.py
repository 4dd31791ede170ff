"""A simple, explainable "is this chat answer coherent?" check for scripts/measure_presets.py.

Owns: the criterion and its reasons. An answer passes when all of these hold:
- it is not empty;
- it is English: at least 97% of its letters are ASCII, it uses English function words
  ("the", "is", "of", ...) and at most a third as many French/Spanish/German/Italian ones
  ("le", "est", "der", "und", ...), or it is at most 3 words ("Paris."); the bundled
  model's garbled answers are mostly such mixed-language text ("La capitale de France est");
- it is not garbled: no U+FFFD, no word over 25 letters, no word repeated 4 times in a row;
- for a factual question, it contains one of the known answers ("Paris").
Must not know: the engine, presets, sampling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ENGLISH_WORDS = frozenset(
    "the a an is are was were be it of to in on and or for with that this as by at from you your i we they "
    "he she his her its can will would do does not no yes have has there what which who how why when".split()
)
# Function words of the languages the bundled model drifts into; none is also an English word.
FOREIGN_WORDS = frozenset(
    "le la les un une des du est et dans pour sur avec qui que sont au aux ce cette "
    "el los las es del por con para una "
    "der die das und ist ein eine nicht mit den dem zu von "
    "il di che della sono gli".split()
)
MIN_ASCII_LETTER_SHARE = 0.97
MAX_WORD_LENGTH = 25
MAX_REPEATS = 3
MAX_BARE_WORDS = 3  # a short answer ("Paris.") needs no function words
WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


@dataclass(frozen=True)
class Verdict:
    is_coherent: bool
    reason: str  # "ok" or the first check that failed


def judge(answer: str, expected: tuple[str, ...] = ()) -> Verdict:
    """Whether `answer` is coherent English (and, when `expected` is given, mentions one of them)."""
    words = [w.lower() for w in WORD.findall(answer)]
    if not words:
        return Verdict(False, "empty")
    letters = [c for c in answer if c.isalpha()]
    if sum(c.isascii() for c in letters) < MIN_ASCII_LETTER_SHARE * len(letters):
        return Verdict(False, "not-english")
    if "\ufffd" in answer or max(len(w) for w in words) > MAX_WORD_LENGTH or _has_run(words):
        return Verdict(False, "garbled")
    num_english = sum(w in ENGLISH_WORDS for w in words)
    num_foreign = sum(w in FOREIGN_WORDS for w in words)
    if num_foreign * 3 > num_english or (num_english == 0 and len(words) > MAX_BARE_WORDS):
        return Verdict(False, "not-english")
    lowered = answer.lower()
    if expected and not any(e.lower() in lowered for e in expected):
        return Verdict(False, "wrong-answer")
    return Verdict(True, "ok")


def _has_run(words: list[str]) -> bool:
    """A word repeated more than MAX_REPEATS times in a row ("the the the the")."""
    run = 1
    for previous, word in zip(words, words[1:]):
        run = run + 1 if word == previous else 1
        if run > MAX_REPEATS:
            return True
    return False
