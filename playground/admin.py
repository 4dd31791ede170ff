"""The admin: every record editable (or, for generations, inspectable) by staff.

Validation lives on the models (`clean()` builds the engine's dataclasses), so the add and
change forms refuse bad values with the dataclass's own message on the right field.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.http import HttpRequest
from django.utils.formats import number_format
from django.utils.html import format_html
from django.utils.translation import gettext, gettext_noop
from django.utils.translation import gettext_lazy as _

from inference.text.chat_template import ChatTemplateError, validate_template
from playground.images import without_data
from playground.models import (
    ApiKey,
    ChatTemplate,
    Conversation,
    Generation,
    LanguageModel,
    LoadReportStatus,
    Message,
    SamplingPreset,
    resolve_source,
)
from playground.web import owners

# Texts of Django's own admin templates (app_list.html's headers for screen readers) that
# Django's zh_Hans catalog leaves untranslated: marked here so our catalog (LOCALE_PATHS, read
# before Django's) carries them.
DJANGO_ADMIN_TEXTS = (gettext_noop("Model name"), gettext_noop("Add link"), gettext_noop("Change or view list link"))


def _pre(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    return format_html('<pre class="pg-pre">{}</pre>', text)


def _rounded(value: float | None, places: int = 1) -> str | None:
    """A measured time or speed as people read it: "2505.2", not "2505.185809000068" (None: the
    admin's empty value)."""
    # rounded first: Django's number_format cuts the digits past `places` (2505.18 -> "2505.1")
    return None if value is None else number_format(round(value, places), places)


class _OptionalJsonField(forms.JSONField):
    """An optional JSON box that is empty when unset (Django's shows None as the text "null")."""

    def prepare_value(self, value: Any) -> Any:
        return "" if value is None else super().prepare_value(value)


class _PlaygroundAdmin(admin.ModelAdmin):
    """Loads the admin additions' stylesheet (`_pre`'s class)."""

    class Media:
        css = {"all": ("css/admin.css",)}


@admin.register(LanguageModel)
class LanguageModelAdmin(_PlaygroundAdmin):
    list_display = (
        "name",
        "source",
        "dtype",
        "device",
        "max_context",
        "default_chat_template",
        "is_enabled",
        "is_default",
        "test_load_status",
        "updated_at",
    )
    list_filter = ("is_enabled", "is_default", "dtype", "device", "trust_remote_code", "test_load_status")
    list_editable = ("is_enabled",)
    search_fields = ("name", "source")
    actions = ("test_load",)
    readonly_fields = ("resolved_source", "stop_ids", "test_load_status", "test_load_at", "test_load_report")
    fieldsets = (
        (None, {"fields": ("name", "source", "resolved_source", "is_enabled", "is_default")}),
        (_("Engine"), {"fields": ("dtype", "device", "max_context", "trust_remote_code", "default_chat_template")}),
        (_("Stopping"), {"fields": ("stop_ids", "eos_token_ids")}),
        (_("Test load"), {"fields": ("test_load_status", "test_load_at", "test_load_report")}),
    )

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "eos_token_ids":
            kwargs["form_class"] = _OptionalJsonField
            kwargs["widget"] = forms.Textarea(
                attrs={"rows": 1, "placeholder": gettext("empty: the model's own, e.g. [2, 7]")}
            )
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    @admin.action(description=_("Test load on a worker (load time, memory, a one-line answer)"))
    def test_load(self, request: HttpRequest, queryset: Any) -> None:
        from playground import dispatch, task_names
        from playground.coord.worker_routing import SHARED_QUEUE

        ids = list(queryset.values_list("pk", flat=True))
        queryset.update(test_load_status=LoadReportStatus.QUEUED, test_load_error="", test_load_result={})
        for model_id in ids:
            # on commit: the worker must see the "queued" row it replaces
            transaction.on_commit(lambda pk=model_id: dispatch.send(task_names.RUN_TEST_LOAD, pk, queue=SHARED_QUEUE))
        self.message_user(
            request,
            gettext(
                "Test load queued for %(count)s model(s) on queue %(queue)r; reload the model's page "
                "to follow it (a busy worker takes it after its current generation)."
            )
            % {"count": len(ids), "queue": SHARED_QUEUE},
            messages.INFO,
        )

    @admin.display(description=_("resolved source (what the workers load)"))
    def resolved_source(self, model: LanguageModel) -> str:
        return resolve_source(model.source) if model.source else "-"

    @admin.display(description=_("stop ids (from the last test load)"))
    def stop_ids(self, model: LanguageModel) -> str:
        result = model.test_load_result or {}
        ids, pieces = result.get("eos_token_ids"), result.get("eos_tokens") or []
        if not ids:
            return gettext("Unknown until a test load succeeds.")
        listed = ", ".join(f"{i} {piece!r}" for i, piece in zip(ids, pieces, strict=False))
        where = (
            gettext("the override below")
            if model.eos_token_ids
            else gettext("generation config, tokenizer EOS, template end of turn")
        )
        return f"{listed} ({where})"

    @admin.display(description=_("report"))
    def test_load_report(self, model: LanguageModel) -> str:
        if model.test_load_status == LoadReportStatus.ERROR:
            return format_html(
                "<strong>{}</strong> {}{}", gettext("Failed:"), model.test_load_error, _pre(model.test_load_result)
            )
        return _pre(model.test_load_result) if model.test_load_result else gettext("No test load yet: use the action.")


@admin.register(SamplingPreset)
class SamplingPresetAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "is_default",
        "greedy",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "max_new_tokens",
        "num_beams",
        "seed",
    )
    list_filter = ("is_default", "greedy", "num_beams")
    search_fields = ("name", "description")
    fieldsets = (
        (None, {"fields": ("name", "description", "is_default")}),
        (
            _("Sampling"),
            {
                "fields": (
                    "greedy",
                    "temperature",
                    "top_k",
                    "top_p",
                    "min_p",
                    "repetition_penalty",
                    "penalize_prompt",
                    "seed",
                )
            },
        ),
        (_("Length and stopping"), {"fields": ("max_new_tokens", "stop", "ignore_eos", "max_thinking_tokens")}),
        (_("Beam search"), {"fields": ("num_beams", "length_penalty", "early_stopping", "num_return_sequences")}),
        (_("Reporting and caching"), {"fields": ("num_alternatives", "use_kv_cache", "use_prefix_cache")}),
    )


@admin.register(ChatTemplate)
class ChatTemplateAdmin(_PlaygroundAdmin):
    list_display = ("name", "description", "updated_at")
    search_fields = ("name", "description", "source")
    readonly_fields = ("preview",)
    fields = ("name", "description", "source", "preview")

    @admin.display(description=_("Preview (a sample conversation, as the model will see it)"))
    def preview(self, template: ChatTemplate) -> str:
        if not template.source:
            return gettext("Save the template to see it rendered.")
        try:
            return _pre(validate_template(template.source))
        except ChatTemplateError as exc:
            return format_html("<strong>{}</strong> {}", gettext("This template fails:"), str(exc))


def owner_ref(owner: str) -> str:
    """What staff see for a record's owner: the API key's name, the keyless local client, or a
    short hash of a browser's owner id (equal for all records of one browser; the id itself is
    no credential, but there is nothing to gain from showing it)."""
    if owner == owners.LOCAL_API_OWNER:
        return gettext("local API client (no key)")
    key_id = owners.api_key_id(owner)
    if key_id is not None:
        key = ApiKey.objects.filter(pk=key_id).first()
        if key is None:
            return gettext("API key #%(id)s (deleted)") % {"id": key_id}
        return gettext("API key %(name)r") % {"name": key.name}
    if not owner:
        return "-"
    return gettext("browser %(hash)s") % {"hash": hashlib.sha256(owner.encode()).hexdigest()[:12]}


class MessageInline(admin.TabularInline):
    model = Message
    fields = ("position", "role", "content", "is_active", "generation")
    readonly_fields = ("generation",)
    extra = 0
    ordering = ("position", "created_at")


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("__str__", "model", "preset", "owned_by", "created_at", "updated_at")
    list_filter = ("model", "preset")
    search_fields = ("title", "system_prompt")
    inlines = (MessageInline,)
    exclude = ("owner",)
    readonly_fields = ("owned_by",)

    @admin.display(description=_("owner"))
    def owned_by(self, conversation: Conversation) -> str:
        return owner_ref(conversation.owner)


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("__str__", "conversation", "role", "position", "is_active", "generation", "created_at")
    list_filter = ("role", "is_active")
    search_fields = ("content",)
    raw_id_fields = ("conversation", "generation")


@admin.register(Generation)
class GenerationAdmin(_PlaygroundAdmin):
    """Inspect-only: generations are written by the worker."""

    list_display = (
        "id",
        "status",
        "kind",
        "model",
        "finish_reason",
        "error_code",
        "num_prompt_tokens",
        "num_cached_tokens",
        "num_generated_tokens",
        "ttft_ms_rounded",
        "decode_tok_s_rounded",
        "worker",
        "created_at",
    )
    list_filter = ("status", "kind", "finish_reason", "error_code", "model")
    search_fields = ("=id", "prompt_text", "text", "error_message", "worker")
    date_hierarchy = "created_at"
    fieldsets = (
        (None, {"fields": ("status", "kind", "model", "chat_template", "conversation", "owned_by")}),
        (_("Outcome"), {"fields": ("finish_reason", "error_code", "error_message", "text")}),
        (
            _("Timings"),
            {
                "fields": (
                    "num_prompt_tokens",
                    "num_cached_tokens",
                    "num_generated_tokens",
                    "prefill_ms_rounded",
                    "ttft_ms_rounded",
                    "decode_tok_s_rounded",
                    "created_at",
                    "started_at",
                    "finished_at",
                )
            },
        ),
        (_("Workers"), {"fields": ("worker", "prefill_worker", "decode_worker")}),
        (_("Details"), {"fields": ("params_display", "inputs_display", "prompt_text", "stats_display", "num_steps")}),
    )

    def get_readonly_fields(self, request: Any, obj: Generation | None = None) -> list[str]:
        return [name for fieldset in self.fieldsets for name in fieldset[1]["fields"]]

    def has_add_permission(self, request: Any) -> bool:
        return False

    @admin.display(description=_("owner"))
    def owned_by(self, generation: Generation) -> str:
        return owner_ref(generation.owner)

    # The timings rounded (the stats below keep the exact values); sorted by the stored ones.
    @admin.display(description=_("prefill ms"), ordering="prefill_ms")
    def prefill_ms_rounded(self, generation: Generation) -> str | None:
        return _rounded(generation.prefill_ms)

    @admin.display(description=_("ttft ms"), ordering="ttft_ms")
    def ttft_ms_rounded(self, generation: Generation) -> str | None:
        return _rounded(generation.ttft_ms)

    @admin.display(description=_("decode tok s"), ordering="decode_tok_s")
    def decode_tok_s_rounded(self, generation: Generation) -> str | None:
        return _rounded(generation.decode_tok_s)

    @admin.display(description=_("params"))
    def params_display(self, generation: Generation) -> str:
        return _pre(generation.params)

    @admin.display(description=_("inputs"))
    def inputs_display(self, generation: Generation) -> str:
        inputs = generation.inputs or {}
        if inputs.get("images"):  # their hashes and sizes, not megabytes of base64
            inputs = {**inputs, "images": without_data(inputs["images"])}
        return _pre(inputs)

    @admin.display(description=_("stats"))
    def stats_display(self, generation: Generation) -> str:
        return _pre(generation.stats)

    @admin.display(description=_("steps"))
    def num_steps(self, generation: Generation) -> int:
        return len(generation.steps)  # the records themselves are too long for a page


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys of the OpenAI-compatible API: created here (shown once), revoked by unticking is_active."""

    list_display = ("name", "key_prefix", "max_concurrent", "is_active", "created_at", "last_used_at")
    list_filter = ("is_active",)
    list_editable = ("is_active",)
    readonly_fields = ("key_prefix", "created_at", "last_used_at")

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        key = None if change else obj.set_new_key()
        super().save_model(request, obj, form, change)
        if key is not None:
            messages.warning(
                request,
                gettext("The new API key is %(key)s - copy it now: it is stored hashed and not shown again.")
                % {"key": key},
            )
