"""The playground's records: models, presets, chat templates, conversations, generations.

Owns: what is stored and the conversions from rows to the engine's settings
(`LanguageModel.to_engine_config`, `SamplingPreset.to_sampling_params`). Must not import
torch, transformers or `inference.engine`: this module loads in the web process.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models, transaction
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from inference.bundled_models import is_bundled_source
from inference.config import VALID_DTYPES, EngineConfig
from inference.sampling_params import PER_REQUEST_FIELDS, SamplingParams
from playground import encoded_json, protocol

SAMPLING_FIELDS = tuple(f.name for f in dataclass_fields(SamplingParams) if f.name not in PER_REQUEST_FIELDS)
_SAMPLING_DEFAULTS = SamplingParams()


def _field_named(exc: ValueError) -> str | None:
    """The SamplingParams field a ValueError starts with ("top_p=1.5 must be ..."), if any."""
    match = re.match(r"\s*(\w+)", str(exc))
    return match.group(1) if match and match.group(1) in SAMPLING_FIELDS else None


def validation_error(exc: ValueError, field_names: tuple[str, ...]) -> ValidationError:
    """The dataclass's ValueError ("top_p=1.5 must be ...") as an error on the field it names."""
    match = re.match(r"\s*(\w+)", str(exc))
    if match and match.group(1) in field_names:
        return ValidationError({match.group(1): str(exc)})
    return ValidationError(str(exc))


class DefaultFlagModel(models.Model):
    """A row type with at most one `is_default` row; saving a new default unsets the old one."""

    is_default = models.BooleanField(_("is default"), default=False)

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        with transaction.atomic():
            if self.is_default:
                type(self).objects.filter(is_default=True).exclude(pk=self.pk).update(is_default=False)
            super().save(*args, **kwargs)

    def validate_constraints(self, exclude: set[str] | None = None) -> None:
        # save() moves the flag, so "one default" cannot be violated by a form: skip it there
        super().validate_constraints(exclude={*(exclude or ()), "is_default"})

    @classmethod
    def default(cls) -> Any:
        return cls.objects.filter(is_default=True).first()


class ChatTemplate(models.Model):
    name = models.CharField(_("name"), max_length=100, unique=True)
    source = models.TextField(_("source"), help_text=_("Jinja2 chat template (Hugging Face format)."))
    description = models.TextField(_("description"), blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("chat template")
        verbose_name_plural = _("chat templates")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from inference.text.chat_template import ChatTemplateError, validate_template

        try:
            validate_template(self.source)
        except ChatTemplateError as exc:
            raise ValidationError({"source": str(exc)}) from exc


class LoadReportStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    OK = "ok", _("Ok")
    ERROR = "error", _("Error")


def resolve_source(source: str) -> str:
    """`source` as the workers get it: relative paths are resolved against PLAYGROUND_DATA_DIR
    (never the current folder, which differs between processes); bundled models ("bundled",
    "bundled:..."), absolute paths and hub ids ("name" or "org/name") are kept. A relative
    "org/name" that exists under the data dir is a path."""
    if is_bundled_source(source) or not source:
        return source
    path = Path(source).expanduser()
    if path.is_absolute():
        return str(path)
    under_data = Path(settings.PLAYGROUND_DATA_DIR) / path
    is_path = source.lower().endswith(".gguf") or source.startswith(".") or source.count("/") > 1
    return str(under_data.resolve()) if is_path or _exists(under_data) else source


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # e.g. a name longer than the file system allows: no such file here
        return False


class LanguageModel(DefaultFlagModel):
    name = models.CharField(_("name"), max_length=100, unique=True)
    source = models.CharField(
        _("source"),
        max_length=500,
        help_text=_(
            "A Hugging Face model folder, a hub id already in the local cache, a .gguf file, "
            'or a bundled model: "bundled" (SmolLM2-135M-Instruct) or "bundled:qwen2.5-coder-0.5b-instruct". '
            "Relative paths are resolved against PLAYGROUND_DATA_DIR."
        ),
    )
    dtype = models.CharField(
        _("weight precision"),
        max_length=16,
        default="auto",
        choices=[(d, d) for d in VALID_DTYPES],
        help_text=_(
            "float32/bfloat16/float16, or weight-only int8 (per channel) / int4 (groups of 32; from a GGUF: "
            "its Q4_0/Q4_1/Q4_K blocks exactly, its other quantized types in 8 bits) with bfloat16 activations, "
            "or gguf (a GGUF file's every tensor in its own format, Q4_0 to Q6_K read as stored, on the CPU). "
            "Fewer bytes per weight: faster decode (it is memory-bound), at a small cost in accuracy (the benchmark "
            "reports the KL divergence). auto: the worker's PLAYGROUND_DTYPE, which by default is gguf for a GGUF "
            "model on a CPU, else bfloat16 on GPUs and on CPUs with bfloat16 units, float32 on other CPUs."
        ),
    )
    device = models.CharField(
        _("device"),
        max_length=16,
        default="auto",
        help_text=_("auto, cpu, cuda or cuda:N; auto: the worker's PLAYGROUND_DEVICE."),
    )
    max_context = models.PositiveIntegerField(
        _("max context"), null=True, blank=True, help_text=_("Caps the context length; empty: the model's own.")
    )
    default_chat_template = models.ForeignKey(
        ChatTemplate,
        verbose_name=_("default chat template"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        help_text=_("Empty: the model's own template."),
    )
    is_enabled = models.BooleanField(_("is enabled"), default=True)
    trust_remote_code = models.BooleanField(
        _("trust remote code"),
        default=False,
        help_text=_("Runs Python code shipped with the model. Only for sources you trust."),
    )
    eos_token_ids = models.JSONField(
        _("eos token ids"),
        null=True,
        blank=True,
        help_text=_(
            "Stop token ids, e.g. [2, 7], replacing the model's own (its generation config, tokenizer EOS "
            "and the chat template's end-of-turn token; a test load shows them). Empty: the model's own."
        ),
    )
    test_load_status = models.CharField(
        _("test load status"), max_length=16, blank=True, choices=LoadReportStatus.choices
    )
    test_load_result = models.JSONField(_("test load result"), default=dict, blank=True)
    test_load_error = models.TextField(_("test load error"), blank=True)
    test_load_at = models.DateTimeField(_("test load at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("model")
        verbose_name_plural = _("models")
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"], condition=models.Q(is_default=True), name="one_default_model"
            )
        ]

    def __str__(self) -> str:
        return self.name

    def to_engine_config(self) -> EngineConfig:
        return EngineConfig(
            source=resolve_source(self.source),
            name=self.name,  # what users chose: the name generations, metrics and errors show
            dtype=settings.PLAYGROUND_DTYPE if self.dtype == "auto" else self.dtype,
            device=settings.PLAYGROUND_DEVICE if self.device == "auto" else self.device,
            max_context=self.max_context,
            trust_remote_code=self.trust_remote_code,
            data_dir=str(settings.PLAYGROUND_DATA_DIR),
            eos_token_ids=tuple(self.eos_token_ids) if isinstance(self.eos_token_ids, list) else None,
        )

    def clean(self) -> None:
        if self.eos_token_ids == []:
            self.eos_token_ids = None
        if self.eos_token_ids is not None and not isinstance(self.eos_token_ids, list):
            raise ValidationError(
                {
                    "eos_token_ids": gettext("%(value)r must be a list of token ids, e.g. [2]")
                    % {"value": self.eos_token_ids}
                }
            )
        try:
            config = self.to_engine_config()
        except ValueError as exc:
            raise validation_error(exc, ("source", "dtype", "device", "max_context", "eos_token_ids")) from exc
        self._check_source(config.source)

    def _check_source(self, source: str) -> None:
        """What the web host can check: the file or folder exists and looks like a model (the
        workers must see the same paths); a hub id is spelled as one (it is loaded by a test load)."""
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id

        from inference.sources import SourceError, check_local_source

        if is_bundled_source(source):
            return
        if not Path(source).is_absolute():
            try:
                validate_repo_id(source)
            except HFValidationError as exc:
                message = gettext("%(source)s is not a model folder, a .gguf file or a Hugging Face id: %(reason)s")
                raise ValidationError({"source": message % {"source": repr(source[:100]), "reason": exc}}) from exc
            return
        try:
            check_local_source(Path(source), trust_remote_code=self.trust_remote_code)
        except SourceError as exc:
            raise ValidationError(
                {"source": gettext("%(reason)s (checked on the web host)") % {"reason": exc}}
            ) from exc
        except OSError as exc:  # e.g. a name longer than the file system allows
            message = gettext("%(source)s cannot be a path on this host: %(reason)s") % {
                "source": repr(source[:100]),
                "reason": exc.strerror,
            }
            raise ValidationError({"source": message}) from exc


class SamplingPreset(DefaultFlagModel):
    """Named sampling settings: one field per `inference.SamplingParams` field."""

    name = models.CharField(_("name"), max_length=100, unique=True)
    description = models.TextField(_("description"), blank=True)
    max_new_tokens = models.PositiveIntegerField(_("max new tokens"), default=_SAMPLING_DEFAULTS.max_new_tokens)
    greedy = models.BooleanField(
        _("greedy"), default=_SAMPLING_DEFAULTS.greedy, help_text=_("Always pick the most likely token.")
    )
    temperature = models.FloatField(
        _("temperature"), default=_SAMPLING_DEFAULTS.temperature, help_text=_("0 = greedy.")
    )
    top_k = models.PositiveIntegerField(_("top k"), default=_SAMPLING_DEFAULTS.top_k, help_text=_("0 = off."))
    top_p = models.FloatField(_("top p"), default=_SAMPLING_DEFAULTS.top_p, help_text=_("1.0 = off."))
    min_p = models.FloatField(_("min p"), default=_SAMPLING_DEFAULTS.min_p, help_text=_("0.0 = off."))
    repetition_penalty = models.FloatField(
        _("repetition penalty"), default=_SAMPLING_DEFAULTS.repetition_penalty, help_text=_("1.0 = off.")
    )
    penalize_prompt = models.BooleanField(
        _("penalize prompt"),
        default=_SAMPLING_DEFAULTS.penalize_prompt,
        help_text=_("The repetition penalty counts the prompt's tokens too. Off: only the answer's own tokens."),
    )
    seed = models.BigIntegerField(
        _("seed"), null=True, blank=True, help_text=_("Empty: a fresh random seed per request.")
    )
    num_alternatives = models.PositiveIntegerField(
        _("num alternatives"), default=_SAMPLING_DEFAULTS.num_alternatives, help_text=_("Top tokens reported per step.")
    )
    stop = models.JSONField(_("stop"), default=list, blank=True, help_text=_('Stop strings, e.g. ["\\n\\n"].'))
    ignore_eos = models.BooleanField(_("ignore eos"), default=_SAMPLING_DEFAULTS.ignore_eos)
    use_kv_cache = models.BooleanField(_("use kv cache"), default=_SAMPLING_DEFAULTS.use_kv_cache)
    use_prefix_cache = models.BooleanField(
        _("use prefix cache"),
        default=_SAMPLING_DEFAULTS.use_prefix_cache,
        help_text=_("Reuse the KV cache of earlier requests' common prefix."),
    )
    num_beams = models.PositiveIntegerField(
        _("num beams"), default=_SAMPLING_DEFAULTS.num_beams, help_text=_("> 1: beam search.")
    )
    length_penalty = models.FloatField(_("length penalty"), default=_SAMPLING_DEFAULTS.length_penalty)
    early_stopping = models.BooleanField(_("early stopping"), default=_SAMPLING_DEFAULTS.early_stopping)
    num_return_sequences = models.PositiveIntegerField(
        _("num return sequences"), default=_SAMPLING_DEFAULTS.num_return_sequences
    )
    max_thinking_tokens = models.PositiveIntegerField(
        _("max thinking tokens"),
        null=True,
        blank=True,
        help_text=_("After this many reasoning tokens `</think>` is forced. Empty: unlimited."),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("sampling preset")
        verbose_name_plural = _("sampling presets")
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"], condition=models.Q(is_default=True), name="one_default_preset"
            )
        ]

    def __str__(self) -> str:
        return self.name

    def to_sampling_params(self, **overrides: Any) -> SamplingParams:
        """The single preset -> `SamplingParams` conversion; `overrides` win (ValueError if invalid)."""
        data = {name: getattr(self, name) for name in SAMPLING_FIELDS}
        data.update(SamplingParams.resolve_overrides(overrides))
        return SamplingParams.from_dict(data)

    def clean(self) -> None:
        """Every bad value at once (not only the first), and the server's limits: a preset
        that can never run is refused here rather than at every request."""
        errors: dict[str, list[str]] = {}
        data = {name: getattr(self, name) for name in SAMPLING_FIELDS}
        if not isinstance(self.stop, list):
            errors["stop"] = [gettext("stop=%(value)r must be a list of strings") % {"value": self.stop}]
            data["stop"] = []
        limit = settings.PLAYGROUND_MAX_NEW_TOKENS
        if isinstance(self.max_new_tokens, int) and self.max_new_tokens > limit:
            errors["max_new_tokens"] = [
                gettext("max_new_tokens=%(value)s exceeds this server's limit of %(limit)s")
                % {"value": self.max_new_tokens, "limit": limit}
            ]
            data["max_new_tokens"] = limit
        # SamplingParams stops at its first bad value: note it, put the default there, go on.
        for _field in SAMPLING_FIELDS:
            try:
                SamplingParams.from_dict(data)
                break
            except ValueError as exc:
                name = _field_named(exc)
                if name is None or name in errors:
                    errors.setdefault("__all__", []).append(str(exc))
                    break
                errors[name] = [str(exc)]
                data[name] = getattr(_SAMPLING_DEFAULTS, name)
        if errors:
            raise ValidationError(errors)


OWNER_HELP = _(
    "Who may read it: a browser's session owner, an API key's record or the local API client "
    "(playground/web/owners.py)."
)


class Conversation(models.Model):
    owner = models.CharField(_("owner"), max_length=40, db_index=True, help_text=OWNER_HELP)
    title = models.CharField(_("title"), max_length=200, blank=True)
    system_prompt = models.TextField(_("system prompt"), blank=True)
    model = models.ForeignKey(LanguageModel, verbose_name=_("model"), null=True, blank=True, on_delete=models.SET_NULL)
    preset = models.ForeignKey(
        SamplingPreset, verbose_name=_("preset"), null=True, blank=True, on_delete=models.SET_NULL
    )
    chat_template = models.ForeignKey(
        ChatTemplate,
        verbose_name=_("chat template"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        help_text=_("Empty: the model's default template."),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("conversation")
        verbose_name_plural = _("conversations")
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"

    def active_messages(self) -> models.QuerySet[Message]:
        return self.messages.filter(is_active=True).order_by("position", "created_at")


class Generation(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", _("Queued")
        RUNNING = "running", _("Running")
        FINISHED = "finished", _("Finished")
        ERROR = "error", _("Error")
        CANCELLED = "cancelled", _("Cancelled")

    class Kind(models.TextChoices):
        CHAT = "chat", _("Chat")
        COMPLETE = "complete", _("Complete")

    ACTIVE_STATUSES = (Status.QUEUED, Status.RUNNING)

    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices, default=Kind.CHAT)
    owner = models.CharField(_("owner"), max_length=40, db_index=True, help_text=OWNER_HELP)
    conversation = models.ForeignKey(
        Conversation,
        verbose_name=_("conversation"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="generations",
    )
    model = models.ForeignKey(LanguageModel, verbose_name=_("model"), null=True, on_delete=models.SET_NULL)
    chat_template = models.ForeignKey(
        ChatTemplate, verbose_name=_("chat template"), null=True, blank=True, on_delete=models.SET_NULL
    )
    params = models.JSONField(_("params"), default=dict, help_text=_("The resolved SamplingParams."))
    inputs = models.JSONField(
        _("inputs"),
        default=dict,
        blank=True,
        help_text=_("complete only: {text, chat, token_ids} as the client sent them."),
    )
    prompt_text = models.TextField(_("prompt text"), blank=True, help_text=_("The prompt as the model saw it."))
    prompt = models.JSONField(_("prompt"), default=dict, blank=True, help_text=_("{spans, tokens}"))
    text = models.TextField(_("text"), blank=True, help_text=_("The answer (partial until finished)."))
    # Encoder: the worker saves the steps as the texts it encoded once (encoded_json.EncodedList).
    steps = models.JSONField(_("steps"), default=list, blank=True, encoder=encoded_json.Encoder)
    stats = models.JSONField(_("stats"), default=dict, blank=True)
    finish_reason = models.CharField(_("finish reason"), max_length=16, blank=True)
    error_code = models.CharField(_("error code"), max_length=32, blank=True)
    error_message = models.TextField(_("error message"), blank=True)
    worker = models.CharField(_("worker"), max_length=200, blank=True)
    prefill_worker = models.CharField(_("prefill worker"), max_length=200, blank=True)
    decode_worker = models.CharField(_("decode worker"), max_length=200, blank=True)
    num_prompt_tokens = models.PositiveIntegerField(_("num prompt tokens"), null=True, blank=True)
    num_cached_tokens = models.PositiveIntegerField(_("num cached tokens"), null=True, blank=True)
    num_generated_tokens = models.PositiveIntegerField(_("num generated tokens"), null=True, blank=True)
    prefill_ms = models.FloatField(_("prefill ms"), null=True, blank=True)
    ttft_ms = models.FloatField(_("ttft ms"), null=True, blank=True)
    decode_tok_s = models.FloatField(_("decode tok s"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        verbose_name = _("generation")
        verbose_name_plural = _("generations")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"Generation {self.pk} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE_STATUSES

    @property
    def opens_reasoning(self) -> bool:
        """Whether the prompt leaves a `<think>` open (the answer begins inside it), as the prompt's
        record says (`protocol.prompt_record`); a row saved before the record said it reads the
        rule from its prompt text."""
        if "opens_reasoning" in self.prompt:
            return bool(self.prompt["opens_reasoning"])
        return protocol.prompt_record(self.prompt_text, [], [])["opens_reasoning"]

    def answer_message_id(self) -> int | None:
        return self.messages.filter(role=Message.Role.ASSISTANT).values_list("id", flat=True).first()

    def terminal_event(self) -> dict[str, Any]:
        """The generation's one terminal event, built from the stored row."""
        assert not self.is_active, f"generation {self.pk} is still {self.status}"
        if self.status == self.Status.ERROR:
            return protocol.generation_error(self.pk, self.error_code or "internal_error", self.error_message)
        return protocol.generation_finished(
            self.pk, self.answer_message_id(), self.finish_reason, self.text, self.stats
        )


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system", _("System")
        USER = "user", _("User")
        ASSISTANT = "assistant", _("Assistant")

    conversation = models.ForeignKey(
        Conversation, verbose_name=_("conversation"), on_delete=models.CASCADE, related_name="messages"
    )
    role = models.CharField(_("role"), max_length=16, choices=Role.choices)
    content = models.TextField(_("content"), blank=True)
    # Attached images (user messages, vision-language models): playground/images.py's records,
    # {media_type, data (base64), content_hash, width, height}, in the order they go in the prompt.
    images = models.JSONField(_("images"), default=list, blank=True)
    position = models.PositiveIntegerField(
        _("position"), help_text=_("Place in the conversation; superseded messages keep theirs.")
    )
    is_active = models.BooleanField(
        _("is active"), default=True, help_text=_("False once an edit or regenerate replaced it.")
    )
    generation = models.ForeignKey(
        Generation,
        verbose_name=_("generation"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="messages",
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("message")
        verbose_name_plural = _("messages")
        ordering = ["position", "created_at"]
        indexes = [models.Index(fields=["conversation", "is_active", "position"])]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:50]}"


class ApiKey(models.Model):
    """A key of the OpenAI-compatible API (`Authorization: Bearer pg-...`), stored as its SHA-256
    only: the admin shows the key once, when it is created."""

    PREFIX = "pg-"

    name = models.CharField(_("name"), max_length=100, help_text=_("Who or what uses this key."))
    key_hash = models.CharField(_("key hash"), max_length=64, unique=True, editable=False)
    key_prefix = models.CharField(
        _("key prefix"), max_length=12, editable=False, help_text=_("The key's first characters.")
    )
    max_concurrent = models.PositiveIntegerField(
        _("max concurrent"),
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text=_(
            "Generations running at once; more wait for their turn. Empty: PLAYGROUND_API_MAX_CONCURRENT "
            "(by default the worker slots, one worker's batch)."
        ),
    )
    is_active = models.BooleanField(_("is active"), default=True, help_text=_("Untick to revoke the key."))
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    last_used_at = models.DateTimeField(_("last used at"), null=True, blank=True)

    class Meta:
        verbose_name = _("API key")
        verbose_name_plural = _("API keys")
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.key_prefix}...)"

    @staticmethod
    def hash(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    def set_new_key(self) -> str:
        """Gives the row a fresh random key and returns it (the only time it is readable)."""
        key = self.PREFIX + secrets.token_urlsafe(24)
        self.key_hash, self.key_prefix = self.hash(key), key[:10]
        return key


class UserLanguage(models.Model):
    """The language a signed-in person picked with the language switch (playground/web/language.py):
    it follows them to every browser. People without an account keep theirs in the session."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, verbose_name=_("user"), on_delete=models.CASCADE, related_name="language_choice"
    )
    language = models.CharField(_("language"), max_length=16, choices=settings.LANGUAGES)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("language choice")
        verbose_name_plural = _("language choices")

    def __str__(self) -> str:
        return f"{self.user}: {self.language}"
