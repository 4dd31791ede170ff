"""A simple, explainable "is this chat answer coherent?" check, in English and in Chinese, for the
quality benchmark (`python -m inference.bench quality`).

Owns: the criterion and its reasons. An answer passes when all of these hold, checked in order
(the reason is the first that fails):
- it is not empty (`empty`);
- it is in the question's language (`wrong-language`):
  - English: at least 97% of its letters are ASCII, it uses English function words ("the",
    "is", "of", ...) and at most a third as many French/Spanish/German/Italian ones ("le",
    "est", "der", "und", ...), or it is at most 3 words ("Paris."); SmolLM2's garbled answers
    are mostly such mixed-language text ("La capitale de France est");
  - Chinese: at least 60% of its words are Chinese, counting each Han character as a word and
    each run of other letters as one ("KV Cache 是一种缓存技术" passes: terms in Latin letters may
    appear; an English answer does not);
- it is not garbled (`garbled`): no U+FFFD, no word over 25 letters (Han characters excepted:
  Chinese writes no spaces, so a whole clause is one run of letters), no word 4 times in a row,
  no character 4 times in a row ("－－－－"), no stretch of 2-16 characters 3 times in a row
  ("la femme, la femme, la femme", "故事故事故事"), no sentence of 12+ characters twice (a long
  answer's loop: "艾丽莎和杰克一起研究这个发现，…" again and again);
- it is long enough where the question asks for a text (`too-short`): at least `min_length`
  words (English) or Han characters (Chinese), e.g. a story;
- for a factual question, it contains one of the known answers (`wrong-answer`: "Paris", "北京").
Must not know: the engine, presets, sampling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LANGUAGES = ("en", "zh")
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
MIN_HAN_SHARE = 0.6  # of the words, each Han character counting as one
MAX_WORD_LENGTH = 25
MAX_REPEATS = 3
MAX_BARE_WORDS = 3  # a short answer ("Paris.") needs no function words
WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
CHAR_RUN = re.compile(r"(\S)\1{3,}")  # one character 4+ times in a row
SENTENCE_END = re.compile(r"[。！？!?\n]|\.\s")
MIN_SENTENCE_CHARS = 12
MAX_SENTENCE_REPEATS = 2  # a sentence of 12+ characters, word for word again: a loop
CHUNK_RUN = re.compile(r"(\S.{1,15}?)\1{2,}", re.DOTALL)  # a 2-16 character stretch 3+ times in a row


@dataclass(frozen=True)
class Verdict:
    is_coherent: bool
    reason: str  # "ok" or the first check that failed


def judge(answer: str, expected: tuple[str, ...] = (), language: str = "en", min_length: int = 0) -> Verdict:
    """Whether `answer` is a coherent answer in `language` ("en" or "zh"); with `expected`, it
    must mention one of them; with `min_length`, have that many words (en) / Han characters (zh)."""
    if language not in LANGUAGES:
        raise ValueError(f"language={language!r} is not one of {LANGUAGES}")
    words = [w.lower() for w in WORD.findall(answer)]
    if not words:
        return Verdict(False, "empty")
    letters = [c for c in answer if c.isalpha()]
    if not _is_in_language(answer, words, letters, language):
        return Verdict(False, "wrong-language")
    if _is_garbled(answer, words):
        return Verdict(False, "garbled")
    length = len(words) if language == "en" else len(HAN.findall(answer))
    if length < min_length:
        return Verdict(False, "too-short")
    lowered = answer.lower()
    if expected and not any(e.lower() in lowered for e in expected):
        return Verdict(False, "wrong-answer")
    return Verdict(True, "ok")


def _is_in_language(answer: str, words: list[str], letters: list[str], language: str) -> bool:
    if language == "zh":
        num_han = len(HAN.findall(answer))
        num_other = sum(not HAN.search(w) for w in words)
        return num_han >= MIN_HAN_SHARE * (num_han + num_other)
    if sum(c.isascii() for c in letters) < MIN_ASCII_LETTER_SHARE * len(letters):
        return False
    num_english = sum(w in ENGLISH_WORDS for w in words)
    num_foreign = sum(w in FOREIGN_WORDS for w in words)
    return num_foreign * 3 <= num_english and (num_english > 0 or len(words) <= MAX_BARE_WORDS)


def _is_garbled(answer: str, words: list[str]) -> bool:
    is_too_long = any(len(w) > MAX_WORD_LENGTH and not HAN.search(w) for w in words)
    if "\ufffd" in answer or is_too_long or _has_run(words):
        return True
    text = " ".join(answer.split())
    runs = [m.group(0) for m in (*CHAR_RUN.finditer(text), *CHUNK_RUN.finditer(text))]
    if any(any(c.isalpha() or not c.isascii() for c in run) for run in runs):  # "......" or "----" is layout
        return True
    sentences = [s.strip() for s in SENTENCE_END.split(answer) if len(s.strip()) >= MIN_SENTENCE_CHARS]
    return any(sentences.count(s) >= MAX_SENTENCE_REPEATS for s in set(sentences))


def _has_run(words: list[str]) -> bool:
    """A word repeated more than MAX_REPEATS times in a row ("the the the the")."""
    run = 1
    for previous, word in zip(words, words[1:]):
        run = run + 1 if word == previous else 1
        if run > MAX_REPEATS:
            return True
    return False
