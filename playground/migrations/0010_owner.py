"""Records belong to an owner id made by the server, no longer to the raw session cookie.

`session_key` becomes `owner` on conversations and generations. Each live browser session gets
the owner `browser:<its key>` in its data (so its conversations stay its own), API rows move to
their key's record (`api-key-3` -> `api-key:3`) and the local client's (`api-local` ->
`api:local`); rows filed under a cookie value no live session has (only a forged or expired
cookie could reach them) get an owner nobody holds.
"""

import hashlib

from django.db import migrations, models
from django.utils import timezone

OWNER_HELP = (
    "Who may read it: a browser's session owner, an API key's record or the local API client "
    "(playground/web/owners.py)."
)
OWNER_FIELD = "playground_owner"  # playground.web.owners.OWNER_FIELD, as of this migration


def _new_owner(old: str, live_keys: set[str]) -> str:
    if old == "api-local":
        return "api:local"
    if old.startswith("api-key-") and old[len("api-key-") :].isdigit():
        return "api-key:" + old[len("api-key-") :]
    if old in live_keys:
        return "browser:" + old
    return "unowned:" + hashlib.sha256(old.encode()).hexdigest()[:24]


def forwards(apps, schema_editor):
    from django.contrib.sessions.backends.db import SessionStore

    Session = apps.get_model("sessions", "Session")
    store = SessionStore()
    live_keys = set()
    for session in Session.objects.filter(expire_date__gt=timezone.now()).iterator():
        try:
            data = store.decode(session.session_data)
        except Exception:  # unreadable (another SECRET_KEY): the browser gets a fresh session
            continue
        if len(session.session_key) <= 32:  # "browser:" + key fits the column
            live_keys.add(session.session_key)
            data.setdefault(OWNER_FIELD, "browser:" + session.session_key)
            Session.objects.filter(pk=session.pk).update(session_data=store.encode(data))
    for model_name in ("Conversation", "Generation"):
        model = apps.get_model("playground", model_name)
        for old in model.objects.values_list("owner", flat=True).distinct():
            model.objects.filter(owner=old).update(owner=_new_owner(old, live_keys))


class Migration(migrations.Migration):
    dependencies = [
        ("playground", "0009_weight_precision_help_names_q4_k"),
        ("sessions", "0001_initial"),
    ]

    operations = [
        migrations.RenameField(model_name="conversation", old_name="session_key", new_name="owner"),
        migrations.RenameField(model_name="generation", old_name="session_key", new_name="owner"),
        migrations.AlterField(
            model_name="conversation",
            name="owner",
            field=models.CharField(db_index=True, help_text=OWNER_HELP, max_length=40),
        ),
        migrations.AlterField(
            model_name="generation",
            name="owner",
            field=models.CharField(db_index=True, help_text=OWNER_HELP, max_length=40),
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
