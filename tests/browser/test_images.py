"""Images in a real browser on the random-weights DeepSeek-VL demo (built by `manage.py
demo_vl_model` into a temporary folder): attach a generated PNG in the chat and the explorer,
get a streamed answer, and the token view shows the image as one block with the engine's token
count, patch grid and KV bytes; the explorer's next step reuses the image's KV by content."""

from __future__ import annotations

import sys

import pytest
from PIL import Image
from playwright.sync_api import expect

from tests.conftest import run_prepare_step

from .test_architecture import settled
from .test_chat import open_chat, send
from .test_explorer import next_token, open_explorer
from .ui import events, sent_commands, wait_for_events

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


@pytest.fixture(scope="module")
def vl_demo(live_stack, tmp_path_factory) -> None:
    out_dir = tmp_path_factory.mktemp("vl-demo") / "deepseek-vl-demo-random"
    argv = [sys.executable, "-m", "django", "demo_vl_model", "--out-dir", str(out_dir)]
    run_prepare_step("demo-vl-model", argv, live_stack.env)


@pytest.fixture
def png_file(tmp_path):
    path = tmp_path / "stripes.png"
    image = Image.new("RGB", (48, 32), (240, 200, 40))
    for x in range(0, 48, 6):
        for y in range(32):
            image.putpixel((x, y), (30, 60, 200))
    image.save(path)
    return path


def choose_vl_model(page, select: str) -> None:
    option = page.locator(f"{select} option", has_text="DeepSeek-VL")
    page.select_option(select, option.get_attribute("value"))
    expect(page.locator(".random-weights-notice").first).to_contain_text("never seen a picture")


def check_image_block(page, root, started: dict, num_cached_tokens: int = 0) -> None:
    """The block shows the engine's numbers: token count, patch grid, KV bytes."""
    vision, image = started["model"]["vision"], started["prompt"]["images"][0]
    assert image["num_tokens"] == vision["tokens_per_image"] == 64
    block = root.locator(".image-block")
    expect(block).to_have_count(1)
    expect(block).to_have_attribute("data-num-tokens", str(vision["tokens_per_image"]))
    expect(block.locator(".image-cell")).to_have_count(vision["grid"][0] * vision["grid"][1])
    kv = page.evaluate("async (n) => (await import('/static/js/format.js')).fmtBytes(n)", image["kv_bytes"])
    assert image["kv_bytes"] == 64 * started["model"]["kv_bytes_per_token"]
    expect(block).to_contain_text(f"{vision['tokens_per_image']} image tokens")
    expect(block).to_contain_text(f"{vision['grid'][0]}×{vision['grid'][1]} patches · {kv} KV")
    # every other token is its own chip
    expect(root.locator(".chip")).to_have_count(len(started["prompt"]["tokens"]) - 64)
    if num_cached_tokens >= image["start"] + 64:
        expect(block).to_have_class("image-block cached")


def test_chat_with_an_image(page, vl_demo, png_file, screenshot_dir):
    open_chat(page, max_tokens=6)
    choose_vl_model(page, "#model-select")
    page.set_input_files("#composer .image-picker", str(png_file))
    expect(page.locator("#image-tray .image-thumb img")).to_have_count(1)
    send(page, "What is in this picture?")
    wait_for_events(page, "generation.finished")
    expect(page.locator("#image-tray")).to_be_hidden()  # the tray empties once sent
    command = sent_commands(page, "generate")[-1]
    assert command["images"][0]["media_type"] == "image/png" and "data:" not in command["images"][0]["data"]
    expect(page.locator(".msg-user .image-thumb img")).to_have_count(1)
    finished = events(page, "generation.finished")[-1]
    assert finished["stats"]["num_generated_tokens"] == 6 and events(page, "generation.tokens")
    started = events(page, "generation.started")[-1]
    page.locator(".msg-assistant .prompt-btn").click()
    dialog = page.locator("#prompt-dialog")
    expect(dialog).to_be_visible()
    check_image_block(page, dialog, started)
    expect(dialog.locator(".prompt-text")).to_contain_text(started["model"]["vision"]["image_token"])
    page.screenshot(path=str(screenshot_dir / "images-chat-prompt.png"))


def test_explorer_with_an_image_reuses_its_kv(page, vl_demo, png_file, screenshot_dir):
    open_explorer(page, "Describe it:")
    choose_vl_model(page, "#ex-model")
    page.set_input_files(".explorer-controls .image-picker", str(png_file))
    expect(page.locator("#ex-image-tray .image-thumb")).to_have_count(1)
    next_token(page, 1)
    next_token(page, 2)
    started, prefilled = events(page, "generation.started")[-1], events(page, "generation.prefilled")[-1]
    image = started["prompt"]["images"][0]
    assert (
        prefilled["num_cached_tokens"] >= image["start"] + image["num_tokens"]
    )  # same pixels: the image's KV is reused
    assert all(len(command["images"]) == 1 for command in sent_commands(page, "complete"))
    check_image_block(page, page.locator("#ex-tokenization"), started, prefilled["num_cached_tokens"])
    page.screenshot(path=str(screenshot_dir / "images-explorer.png"), full_page=True)


def test_the_architecture_card_shows_image_tokens(page, vl_demo, screenshot_dir):
    page.goto("/architecture/")
    option = page.locator("#arch-model option", has_text="DeepSeek-VL")
    page.select_option("#arch-model", option.get_attribute("value"))
    page.select_option("#arch-dtype", "float32")
    # The card renders once per change; wait until it shows this choice before reading it (the
    # screenshot below failed once on a card replaced after its text had matched).
    settled(page, f"{option.get_attribute('value')}?context=4096&dtype=float32")
    card = page.locator("#arch-card")
    expect(card).to_contain_text("Images (tokens and KV cache per image)")
    model_id = option.get_attribute("value").split(":")[1]
    api = page.evaluate(f"async () => (await fetch('/api/models/{model_id}/architecture/?dtype=float32')).json()")
    own = api["vision"]["model"]

    def value(row_name: str):
        return card.locator("tr", has=page.locator("th", has_text=row_name)).locator("td").first

    expect(value("this model")).to_have_text(f"{own['tokens_per_image']} tokens")
    for tiles, total in (("1×1", "421"), ("2×1", "617"), ("2×2", "1,023"), ("3×3", "2,017")):
        expect(value(f"VL2, {tiles} tiles")).to_have_text(f"{total} tokens")
    card.locator(".arch-block", has_text="Images").screenshot(path=str(screenshot_dir / "images-architecture.png"))
