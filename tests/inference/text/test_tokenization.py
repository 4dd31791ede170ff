"""inference.text.tokenization: exact token bytes, pieces, and UTF-8-safe incremental decoding."""

from __future__ import annotations

import random
import threading
import time

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from inference.models.tiny import make_tiny_tokenizer
from inference.text.tokenization import (
    IncrementalDetokenizer,
    TokenInfo,
    encode,
    token_bytes,
    token_infos,
    token_table,
    tokenize,
)

TEXTS = [
    "Hello, world!",
    "héllo naïve café Ångström",
    "emoji: 👋🏽 👨‍👩‍👧 🇺🇳 🙂",
    "中文字符和日本語のテキスト、한국어",
    "def f(x):\n    return {'a': x ** 2}  # code\n\t\tTabs",
    "  leading and trailing spaces  ",
    "<|im_start|>user\nHi<|im_end|>\n",
]


@pytest.fixture(scope="module")
def tokenizer(bundled):
    return bundled.tokenizer


def stream(tokenizer, ids: list[int], skip_special_tokens: bool = False) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    return [detokenizer.push(i) for i in ids] + [detokenizer.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_rebuild_the_text(tokenizer, text: str) -> None:
    infos = tokenize(tokenizer, text)
    assert [i.id for i in infos] == tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(i.bytes for i in infos) == text.encode("utf-8")


def test_every_piece_is_what_the_tokenizer_decodes(tokenizer) -> None:
    table = token_table(tokenizer)
    assert table.scheme == "byte_level" and len(table.pieces) == len(tokenizer)
    mismatches = [i for i in range(len(tokenizer)) if table.pieces[i] != tokenizer.decode([i])]
    assert mismatches == []


def test_special_tokens(tokenizer) -> None:
    ids = encode(tokenizer, "<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2  # parsed as special tokens, no BOS/EOS added
    first = token_infos(tokenizer, ids)[0]
    assert first == TokenInfo(1, "<|im_start|>", b"<|im_start|>", True)
    assert not token_infos(tokenizer, [ids[1]])[0].is_special
    assert first.to_dict() == {"id": 1, "piece": "<|im_start|>", "bytes": b"<|im_start|>".hex(), "is_special": True}


def test_a_partial_character_has_a_replacement_piece_and_exact_bytes(tokenizer) -> None:
    ids = encode(tokenizer, "👋")
    assert len(ids) > 1  # the emoji is split across byte tokens
    infos = token_infos(tokenizer, ids)
    assert b"".join(i.bytes for i in infos) == "👋".encode()
    assert all("\ufffd" in i.piece for i in infos)


def test_token_bytes_edge_ids(tokenizer) -> None:
    assert token_bytes(tokenizer, len(tokenizer) + 5) == b""  # models may pad their vocabulary
    with pytest.raises(ValueError, match="non-negative"):
        token_bytes(tokenizer, -1)
    assert token_table(tokenizer) is token_table(tokenizer)


# --- incremental detokenization --------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_decode(tokenizer, text: str) -> None:
    ids = encode(tokenizer, text)
    deltas = stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)  # never a broken character mid-stream


def test_emoji_split_across_tokens_streams_whole(tokenizer) -> None:
    ids = encode(tokenizer, "a👨‍👩‍👧b")
    deltas = stream(tokenizer, ids)
    assert "" in deltas  # bytes were held back...
    assert [d for d in deltas if d] == ["a", "👨", "\u200d", "👩", "\u200d", "👧", "b"]  # ...and came out whole


@pytest.mark.parametrize("skip_special_tokens", [False, True])
def test_random_ids_stream_like_decode(tokenizer, skip_special_tokens: bool) -> None:
    rng = random.Random(1234)
    high_bytes = [i for i in range(len(tokenizer)) if token_bytes(tokenizer, i)[:1] >= b"\x80"]
    for _ in range(300):
        pool = high_bytes if rng.random() < 0.5 else range(len(tokenizer))  # many partial characters
        ids = [rng.choice(pool) for _ in range(rng.randrange(1, 25))]
        if rng.random() < 0.3:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice([0, 1, 2]))
        assert "".join(stream(tokenizer, ids, skip_special_tokens)) == tokenizer.decode(
            ids, skip_special_tokens=skip_special_tokens
        ), ids


def test_flush_turns_an_incomplete_tail_into_a_replacement_character(tokenizer) -> None:
    ids = encode(tokenizer, "ok 👋")
    detokenizer = IncrementalDetokenizer(tokenizer)
    deltas = [detokenizer.push(i) for i in ids[:-1]]
    assert "".join(deltas) == "ok "
    assert detokenizer.flush() == "\ufffd"
    assert detokenizer.text == "ok \ufffd"


def test_push_does_not_decode_the_sequence(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    detokenizer = IncrementalDetokenizer(tokenizer)  # the table is built (and cached) here

    def refuse(*args, **kwargs):
        raise AssertionError("push must not call tokenizer.decode")

    monkeypatch.setattr(type(tokenizer), "decode", refuse)
    assert "".join(detokenizer.push(i) for i in encode(tokenizer, "plain table lookups")) == "plain table lookups"


def test_skip_special_tokens(tokenizer) -> None:
    ids = encode(tokenizer, "<|im_start|>assistant\nHi<|im_end|>")
    assert "".join(stream(tokenizer, ids, skip_special_tokens=True)) == "assistant\nHi"


# --- other vocabularies ---------------------------------------------------------------------


def test_tiny_byte_level_tokenizer() -> None:
    tokenizer = make_tiny_tokenizer(["<|bos|>", "<|eos|>"])
    text = "zé 中<|eos|>"
    ids = encode(tokenizer, text)
    assert ids[-1] == 257 and len(ids) == len("zé 中".encode()) + 1
    assert b"".join(token_bytes(tokenizer, i) for i in ids) == text.encode()
    assert "".join(stream(tokenizer, ids)) == text


def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """Llama-2 style: `▁` for spaces and `<0xNN>` byte fallback."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for word in ["▁hello", "▁world", "h", "e", "l", "o", "w", "r", "d", "▁"]:
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def test_sentencepiece_spaces_and_byte_fallback() -> None:
    tokenizer = sentencepiece_tokenizer()
    table = token_table(tokenizer)
    assert table.scheme == "sentencepiece"
    vocab = tokenizer.get_vocab()
    assert token_bytes(tokenizer, vocab["▁hello"]) == b" hello"
    assert token_bytes(tokenizer, vocab["<0xE4>"]) == b"\xe4"
    assert token_bytes(tokenizer, vocab["</s>"]) == b"</s>"
    ids = [vocab["▁hello"], vocab["▁world"], *(vocab[f"<0x{b:02X}>"] for b in "中".encode())]
    # the decoder strips the leading space of the text; the token's own bytes keep it
    assert "".join(stream(tokenizer, ids)) == " " + tokenizer.decode(ids) == " hello world中"


def test_other_tokenizers_fall_back_to_decode() -> None:
    vocab = {"[UNK]": 0, "hello": 1, "##s": 2, "world": 3}
    backend = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    assert token_table(tokenizer).scheme == "decode"
    assert [token_bytes(tokenizer, i) for i in range(4)] == [tokenizer.decode([i]).encode() for i in range(4)]


# --- BOS before raw text: the tokenizer's own rule ------------------------------------------


def test_raw_text_gets_bos_when_the_tokenizer_asks_for_it_and_only_then() -> None:
    from inference.text.tokenization import bos_for_raw_text

    asks = make_tiny_tokenizer(("<bos>", "<eos>"), add_bos_token=True)  # Gemma-style
    bos = bos_for_raw_text(asks, "The capital of France is")
    assert bos is not None and (bos.id, bos.piece, bos.is_special) == (256, "<bos>", True)
    assert asks.encode("ab") == [256, 97, 98]  # what the rule reads: the tokenizer's own encoding
    assert bos_for_raw_text(asks, "<bos>The capital") is None  # already there: not twice
    assert bos_for_raw_text(asks, "") is None  # no text (token ids only): nothing is added
    does_not = make_tiny_tokenizer(("<bos>", "<eos>"))  # SmolLM2 / Qwen-style
    assert bos_for_raw_text(does_not, "The capital of France is") is None


@pytest.mark.parametrize("flag", [True, False])
def test_a_gguf_that_asks_for_bos_keeps_asking_once_converted(tmp_path, flag: bool) -> None:
    """`tokenizer.ggml.add_bos_token` travels into the converted folder's tokenizer."""
    from transformers import AutoTokenizer

    from inference.models.bundled import ensure_converted
    from inference.text.tokenization import bos_for_raw_text
    from tests.inference.tiny_gguf import write_tiny_gguf

    write_tiny_gguf(tmp_path / "tiny.gguf", add_bos_token=flag)
    tokenizer = AutoTokenizer.from_pretrained(ensure_converted(tmp_path / "tiny.gguf", tmp_path / "converted"))
    bos = bos_for_raw_text(tokenizer, "hello")
    assert (bos.piece if bos else None) == ("<|bos|>" if flag else None)


def test_a_tokenizer_encodes_one_text_at_a_time_whatever_the_threads() -> None:
    """A worker builds its prompts on several task threads at once. A fast tokenizer's Rust object
    checks (and may reset) its truncation settings in each call: a second thread's call meanwhile
    fails with "Already borrowed"."""
    inside, most, count_lock = 0, 0, threading.Lock()

    class Probe:  # a tokenizer that notes how many threads are inside its encode
        def encode(self, text: str, add_special_tokens: bool) -> list[int]:
            nonlocal inside, most
            with count_lock:
                inside += 1
                most = max(most, inside)
            time.sleep(0.01)  # the GIL is free: another thread would come in now
            with count_lock:
                inside -= 1
            return [len(text)]

    probe, results = Probe(), {}
    threads = [threading.Thread(target=lambda n=n: results.update({n: encode(probe, "x" * n)})) for n in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert results == {n: [n] for n in range(1, 7)}
    assert most == 1
