"""Building a request's prompt for one model: from chat messages or raw text to checked token ids.

Owns: the model's tokenizer as the rest of the system sees it (tokenize, pieces, token infos),
rendering chat messages through a template (the model's own or one given), DeepSeek-VL's image
placeholders and their expansion into each image's block of tokens, and the checks a prompt
must pass before it is queued (not empty, ids inside the vocabulary, room left in the context,
images that match their tokens). Refusals are `PromptError`s with a stable code.
Must not know: requests in flight, the KV cache, Django.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from inference.sampling_params import SamplingParams
from inference.text.chat_template import RenderedPrompt, Span, TemplateTokens, render_chat
from inference.text.reasoning import THINK_CLOSE
from inference.text.tokenization import TokenInfo, TokenTable, bos_for_raw_text, token_infos, token_table, tokenize
from inference.vision.encoder import VisionSpec
from inference.vision.images import PromptImage
from inference.vision.spans import ImageSpan, image_spans


class PromptError(ValueError):
    """A prompt the model cannot take; `code` is the protocol's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Prompt:
    """A built prompt: its text (with its spans), every token and where its images are."""

    text: str
    spans: tuple[Span, ...]
    tokens: tuple[TokenInfo, ...]
    image_spans: tuple[ImageSpan, ...] = ()
    dropped_reasoning: tuple[int, ...] = ()
    images: tuple[PromptImage, ...] = field(default=(), repr=False)

    @property
    def token_ids(self) -> list[int]:
        return [t.id for t in self.tokens]


class PromptBuilder:
    def __init__(
        self, tokenizer: Any, chat_template: str | None, name: str, vocab_size: int, max_context: int, vision=None
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.name = name  # the model's, for messages
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.vision: VisionSpec | None = vision
        self.table: TokenTable = token_table(tokenizer)
        self.template_tokens = TemplateTokens.from_tokenizer(tokenizer)

    # ---- the tokenizer -------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[TokenInfo]:
        return tokenize(self.tokenizer, text)

    def encode(self, text: str) -> list[int]:
        return [t.id for t in self.tokenize(text)]

    def token_infos(self, token_ids: Sequence[int]) -> list[TokenInfo]:
        return token_infos(self.tokenizer, list(token_ids))

    def piece(self, token_id: int) -> str:
        return self.table.piece_of(token_id)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def think_close_ids(self) -> tuple[int, ...]:
        """`</think>` as the thinking budget forces it: the vocabulary's own token when it has
        one (R1's tokenizers do), else the tag's token sequence."""
        if THINK_CLOSE in self.table.pieces:
            return (self.table.pieces.index(THINK_CLOSE),)
        return tuple(self.encode(THINK_CLOSE))

    # ---- prompts -------------------------------------------------------------------------------

    def render_chat(
        self,
        messages: list[dict],
        template: str | None = None,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> RenderedPrompt:
        source = template or self.chat_template
        if not source:
            raise PromptError("invalid_params", f"model {self.name!r} has no chat template; choose one")
        return render_chat(
            messages,
            source,
            special_tokens=self.template_tokens,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
        )

    def with_image_placeholders(self, text: str, num_images: int) -> str:
        """DeepSeek-VL's convention: one image token per image, on its own line before the text."""
        if not num_images or self.vision is None:
            return text  # a text-only model refuses the images in `build`
        return self.vision.image_token * num_images + "\n" + text

    def build(
        self,
        *,
        messages: list[dict] | None = None,
        text: str = "",
        template: str | None = None,
        extra_token_ids: Sequence[int] = (),
        images: Sequence[PromptImage] = (),
        tools: list[dict] | None = None,
    ) -> Prompt:
        """The prompt of chat `messages` (rendered) or of raw `text`, then `extra_token_ids`;
        each image placeholder expanded into its image's block of tokens. Checked (`PromptError`).
        Raw text starts with the BOS its tokenizer asks for (`bos_for_raw_text`), shown in the
        prompt's text as its piece in a special span, like a template's own BOS."""
        dropped: tuple[int, ...] = ()
        bos = None
        if messages is not None:
            try:
                rendered = self.render_chat(messages, template, tools=tools)
            except PromptError:
                raise
            except ValueError as exc:  # includes ChatTemplateError
                raise PromptError("invalid_params", f"the prompt could not be built: {exc}") from exc
            text, spans, dropped = rendered.text, rendered.spans, rendered.dropped_reasoning
        else:
            spans = (Span(0, len(text), "content", None),) if text else ()
            bos = bos_for_raw_text(self.tokenizer, text)
        self._check_vocabulary(extra_token_ids)
        tokens = self.tokenize(text) + self.token_infos(extra_token_ids)
        if bos is not None:
            shift = len(bos.piece)
            spans = (
                Span(0, shift, "special", None),
                *(replace(s, start=s.start + shift, end=s.end + shift) for s in spans),
            )
            text, tokens = bos.piece + text, [bos, *tokens]
        tokens, found = self._expand_images(tokens, images)
        return Prompt(text, tuple(spans), tuple(tokens), found, dropped, tuple(images))

    def _expand_images(
        self, tokens: list[TokenInfo], images: Sequence[PromptImage]
    ) -> tuple[list[TokenInfo], tuple[ImageSpan, ...]]:
        if not images:
            return tokens, ()
        if self.vision is None:
            raise PromptError("images_not_supported", f"model {self.name!r} takes no images")
        expanded: list[TokenInfo] = []
        for token in tokens:
            expanded += [token] * (self.vision.tokens_per_image if token.id == self.vision.image_token_id else 1)
        try:
            return expanded, self.image_spans_of([t.id for t in expanded], images)
        except ValueError as exc:  # e.g. the text itself holds the image token
            raise PromptError("invalid_params", f"the images do not fit the prompt: {exc}") from exc

    def expand_image_placeholders(self, token_ids: Sequence[int]) -> list[int]:
        """Each image token (one per image, as the chat template writes it) as the image's block of tokens."""
        return self.vision.expand_placeholders(token_ids) if self.vision else list(token_ids)

    def image_spans_of(self, token_ids: Sequence[int], images: Sequence[PromptImage]) -> tuple[ImageSpan, ...]:
        hashes = [image.content_hash for image in images]
        return image_spans(token_ids, self.vision.image_token_id, self.vision.tokens_per_image, hashes)

    # ---- checks before a request is queued ------------------------------------------------------

    def _check_vocabulary(self, token_ids: Sequence[int]) -> None:
        bad = [i for i in token_ids if not 0 <= int(i) < self.vocab_size]
        if bad:
            raise PromptError(
                "invalid_params", f"token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})"
            )

    def check(
        self, prompt_ids: Sequence[int], params: SamplingParams, images: Sequence[PromptImage] = ()
    ) -> tuple[list[int], tuple[ImageSpan, ...]]:
        """The prompt as ints, and where its images' tokens are; `PromptError` when the model
        cannot take it."""
        ids = [int(i) for i in prompt_ids]
        if not ids:
            raise PromptError("invalid_params", "prompt is empty: at least one token is needed")
        self._check_vocabulary(ids)
        if len(ids) >= self.max_context:
            raise PromptError(
                "prompt_too_long",
                f"prompt has {len(ids)} tokens; the model's context is {self.max_context} "
                "(at least one token must be left to generate)",
            )
        if self.vision is None:
            if images:
                raise PromptError(
                    "images_not_supported", f"model {self.name!r} takes no images (it has no vision tower)"
                )
            return ids, ()
        if images and params.is_beam_search:
            raise PromptError("invalid_params", "beam search with images is not supported")
        try:
            return ids, self.image_spans_of(ids, images)
        except ValueError as exc:
            raise PromptError("invalid_params", str(exc)) from exc
