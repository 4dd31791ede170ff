"""Images through the engine on the random-weights DeepSeek-VL demo: pixels go through the vision
tower once, cached decode equals full recompute, the prefix cache tells images apart by content,
and an image's KV survives the prefill/decode hand-over."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from inference import EngineConfig, Finished, Prefilled, SamplingParams, Step
from inference.engine import Engine
from inference.introspect import architecture as arch
from inference.introspect.vision_tokens import vision_section, vl2_image_tokens
from inference.models import vl_demo
from inference.models.loader import load_model
from inference.models.tiny import make_tiny_tokenizer
from inference.requests import Request, Vocabulary
from inference.text.tokenization import token_table
from inference.vision.images import ImageError, PromptImage, decode_image
from inference.vision.spans import ImageSpan

GREEDY = SamplingParams(max_new_tokens=6, greedy=True, ignore_eos=True, num_alternatives=5)


@pytest.fixture(scope="module")
def vl_dir(data_dir: Path, bundled_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # built in a temporary folder: the shared data dir only lends the bundled tokenizer
    return vl_demo.ensure_vl_demo_model(data_dir, out_dir=tmp_path_factory.mktemp("vl") / vl_demo.VL_DEMO_FOLDER_NAME)


@pytest.fixture(scope="module")
def loaded(vl_dir: Path, data_dir: Path):
    return load_model(EngineConfig(source=str(vl_dir), device="cpu", dtype="float32", data_dir=str(data_dir)))


def new_engine(loaded) -> Engine:
    return Engine(loaded, EngineConfig(source="vl", kv_cache_bytes=64 << 20))


@pytest.fixture(scope="module")
def engine(loaded) -> Engine:
    return new_engine(loaded)


def png(colour: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    image = Image.new("RGB", size, colour)
    image.putpixel((3, 4), (255 - colour[0], 10, 200))  # not one flat colour
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


VOCAB = Vocabulary(make_tiny_tokenizer(), token_table(make_tiny_tokenizer()), (), (1,), 64)
RED, BLUE = decode_image(png((200, 20, 20))), decode_image(png((20, 20, 200)))


def image_prompt(engine: Engine, text: str = "What is in this picture?", num_images: int = 1) -> list[int]:
    token = engine.vision.image_token
    rendered = engine.prompts.render_chat([{"role": "user", "content": token * num_images + "\n" + text}])
    return engine.prompts.expand_image_placeholders(engine.prompts.encode(rendered.text))


def steps_of(events) -> list[Step]:
    return [e for e in events if isinstance(e, Step)]


def test_the_folder_says_random_weights_and_has_its_image_processor(vl_dir: Path, engine: Engine) -> None:
    marker = json.loads((vl_dir / "demo.json").read_text())
    assert marker["random_weights"] is True and "random weights" in marker["name"]
    assert json.loads((vl_dir / "config.json").read_text())["model_type"] == "deepseek_vl"
    assert (vl_dir / "preprocessor_config.json").is_file()
    info = engine.model_info()
    assert info["runner"] == "transformers" and info["num_layers"] == 4
    assert info["vision"]["tokens_per_image"] == 64 and info["vision"]["grid"] == [8, 8]
    assert info["vision"]["image_token"] == "<image_placeholder>"
    # 4 layers x (2 kv heads x 32 dims) x keys and values x float32
    assert info["kv_bytes_per_token"] == 4 * 2 * 2 * 32 * 4


def test_cached_decode_equals_full_recompute(engine: Engine) -> None:
    prompt = image_prompt(engine)
    cached = steps_of(engine.generate(prompt, GREEDY, images=[RED]))
    recomputed = steps_of(
        engine.generate(prompt, SamplingParams(**{**GREEDY.to_dict(), "use_kv_cache": False}), images=[RED])
    )
    assert [s.token_id for s in cached] == [s.token_id for s in recomputed]
    torch.testing.assert_close(
        torch.tensor([s.raw_logprob for s in cached]),
        torch.tensor([s.raw_logprob for s in recomputed]),
        atol=1e-4,
        rtol=0,
    )
    assert all(len(s.top_raw) == 5 and len(s.top_processed) == 5 for s in cached)  # streamed top-k
    assert cached[-1].kv_cache_bytes == engine.info.kv_bytes_per_token * (len(prompt) + 5)


def test_the_pixels_reach_the_model(engine: Engine) -> None:
    prompt = image_prompt(engine)
    params = SamplingParams(max_new_tokens=1, greedy=True, use_prefix_cache=False, num_alternatives=5)
    red, blue = (steps_of(engine.generate(prompt, params, images=[image]))[0] for image in (RED, BLUE))
    assert [a.logprob for a in red.top_raw] != pytest.approx([a.logprob for a in blue.top_raw], abs=1e-6)


def test_the_prefix_cache_keys_images_by_content(loaded) -> None:
    engine = new_engine(loaded)
    prompt = image_prompt(engine)
    span = ImageSpan(start=prompt.index(engine.vision.image_token_id), num_tokens=64, content_hash=RED.content_hash)
    params = SamplingParams(max_new_tokens=2, greedy=True, num_alternatives=3)

    def run(image: PromptImage) -> tuple[Prefilled, list[Step]]:
        events = list(engine.generate(prompt, params, images=[image]))
        return events[0], steps_of(events)

    run(RED)
    blue_prefilled, blue_steps = run(BLUE)  # identical token ids, another picture: only the text before it
    assert 0 < blue_prefilled.num_cached_tokens <= span.start
    red_prefilled, red_steps = run(RED)  # the same picture: the image's KV is reused
    assert red_prefilled.num_cached_tokens >= span.end
    fresh = steps_of(new_engine(loaded).generate(prompt, params, images=[BLUE]))
    assert [s.token_id for s in blue_steps] == [s.token_id for s in fresh]
    assert blue_steps[0].raw_logprob == pytest.approx(fresh[0].raw_logprob, abs=1e-4)


def test_an_image_is_one_atomic_span_keyed_by_its_content() -> None:
    spans = [ImageSpan(start=3, num_tokens=4, content_hash="ab")]
    seq = Request.new(0, [1, 2, 3, 9, 9, 9, 9, 5], SamplingParams(), VOCAB, torch.device("cpu"), image_spans=spans).seq
    assert [seq.chunk_end(0, n) for n in (2, 3, 4, 6, 7, 9)] == [2, 3, 3, 3, 7, 9]
    keys = seq.key_ids(0, 8)
    assert keys[:3] == (1, 2, 3) and keys[7] == 5 and len(set(keys[3:7])) == 1 and keys[3] < 0
    other = Request.new(
        0, seq.token_ids, SamplingParams(), VOCAB, torch.device("cpu"), image_spans=[ImageSpan(3, 4, "cd")]
    )
    assert other.seq.key_ids(0, 8)[3] != keys[3]


def test_image_kv_survives_the_prefill_decode_handover(loaded) -> None:
    prefill, decode = new_engine(loaded), new_engine(loaded)
    prompt = image_prompt(engine=prefill)
    expected = steps_of(new_engine(loaded).generate(prompt, GREEDY, images=[RED]))
    handoff = prefill.prefill_for_handoff(prompt, GREEDY, images=[RED])
    received = decode.import_handoff(prefill.export_handoff(handoff))
    assert received.image_spans == handoff.image_spans and received.image_spans[0].content_hash == RED.content_hash
    events = list(decode.generate(received.prompt_ids, received.params, handoff=received))
    assert [s.token_id for s in steps_of(events)] == [s.token_id for s in expected]
    assert isinstance(events[-1], Finished)
    # the decode worker's prefix cache knows whose pixels those tokens were
    again = list(decode.generate(prompt, GREEDY, images=[BLUE]))[0]
    assert again.num_cached_tokens <= handoff.image_spans[0].start


def test_queued_requests_with_images_run_in_the_batch(engine: Engine) -> None:
    prompt = image_prompt(engine, num_images=2)
    request_id = engine.add_request(prompt, GREEDY, images=[RED, BLUE])
    events = []
    while engine.has_unfinished:
        events += [event for rid, event in engine.step() if rid == request_id]
    assert isinstance(events[-1], Finished) and events[0].num_prompt_tokens == len(prompt)


def test_the_prompt_must_hold_one_block_per_image(engine: Engine) -> None:
    prompt = image_prompt(engine)
    with pytest.raises(ValueError, match="64 image tokens but 2 image"):
        engine.add_request(prompt, GREEDY, images=[RED, BLUE])
    with pytest.raises(ValueError, match="beam search"):
        engine.add_request(prompt, SamplingParams(num_beams=2, max_new_tokens=2), images=[RED])
    broken = prompt.copy()
    broken[prompt.index(engine.vision.image_token_id) + 10] = 42
    broken.insert(0, engine.vision.image_token_id)
    with pytest.raises(ValueError, match="not one block"):
        engine.add_request(broken, GREEDY, images=[RED])


def test_a_text_model_refuses_images(bundled) -> None:
    engine = Engine(bundled, EngineConfig())
    with pytest.raises(ValueError, match="takes no images"):
        engine.add_request(engine.prompts.encode("Hi"), GREEDY, images=[RED])
    assert engine.model_info()["vision"] is None


@pytest.mark.parametrize(
    ("data", "limits", "code"),
    [
        (b"", {}, "invalid_image"),
        (b"not an image at all", {}, "invalid_image"),
        (png((1, 2, 3))[:60], {}, "invalid_image"),  # truncated
        (png((1, 2, 3)), {"max_bytes": 50}, "image_too_large"),
        (png((1, 2, 3), size=(100, 100)), {"max_pixels": 99 * 99}, "image_too_many_pixels"),
    ],
)
def test_bad_images_get_stable_codes(data: bytes, limits: dict, code: str) -> None:
    with pytest.raises(ImageError) as caught:
        decode_image(data, **limits)
    assert caught.value.code == code


def test_unsupported_formats_and_the_content_hash() -> None:
    bmp = io.BytesIO()
    Image.new("RGB", (4, 4)).save(bmp, format="BMP")
    with pytest.raises(ImageError) as caught:
        decode_image(bmp.getvalue())
    assert caught.value.code == "unsupported_image_type"
    jpeg_free = Image.new("RGB", (40, 30), (200, 20, 20))
    jpeg_free.putpixel((3, 4), (55, 10, 200))
    assert PromptImage.from_pil(jpeg_free).content_hash == RED.content_hash  # pixels, not file bytes
    assert RED.content_hash != BLUE.content_hash and RED.media_type == "image/png"


def test_vl2_tiling_counts_are_the_published_ones() -> None:
    counts = {tuple(row["tiles"]): row["total"] for row in vision_section({"vision_config": {}}, 1)["vl2_tilings"]}
    assert counts == {(1, 1): 421, (2, 1): 617, (2, 2): 1023, (3, 3): 2017}
    assert vl2_image_tokens(1, 1)["global"] == 210 and vl2_image_tokens(1, 1)["separator"] == 1
    with pytest.raises(ValueError):
        vl2_image_tokens(0, 1)


def test_the_architecture_card_counts_the_demos_image_tokens(vl_dir: Path, engine: Engine) -> None:
    card = arch.card(json.loads((vl_dir / "config.json").read_text()), context=1, dtype="float32")
    assert card["shape"]["model_type"] == "llama" and card["shape"]["layers"] == 4  # the language model's
    assert card["kv_cache"]["bytes_per_token"] == engine.info.kv_bytes_per_token
    own = card["vision"]["model"]
    assert own["tokens_per_image"] == engine.model_info()["vision"]["tokens_per_image"] == 64
    assert own["kv_bytes_per_image"] == 64 * engine.info.kv_bytes_per_token
    one_tile = card["vision"]["vl2_tilings"][0]
    assert one_tile["kv_bytes"] == 421 * engine.info.kv_bytes_per_token
    assert arch.reference_card("deepseek_v3_671b")["vision"] is None
