"""Django settings, read from the environment with defaults that work on a laptop.

Owns: configuration only. Every knob is an environment variable (see the README); nothing
here imports the inference engine's heavy parts.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value.strip() else default
    except ValueError:
        raise ValueError(f"{name}={value!r} must be an integer") from None


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    try:
        return float(value) if value.strip() else default
    except ValueError:
        raise ValueError(f"{name}={value!r} must be a number") from None


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def load_secret_key(data_dir: Path) -> str:
    """`SECRET_KEY` from the environment, else one generated once and kept in the data dir.

    Never a key in the source: a committed key would sign every deployment's sessions.
    """
    if os.environ.get("SECRET_KEY"):
        return os.environ["SECRET_KEY"]
    path = data_dir / "secret_key"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


PLAYGROUND_DATA_DIR = Path(os.environ.get("PLAYGROUND_DATA_DIR") or BASE_DIR / "data").resolve()
PLAYGROUND_DEVICE = os.environ.get("PLAYGROUND_DEVICE", "auto")
PLAYGROUND_DTYPE = os.environ.get("PLAYGROUND_DTYPE", "auto")

# Limits (see playground/limits.py). Chars are a cheap check in the web process;
# tokens are checked exactly by the worker, which has the tokenizer.
PLAYGROUND_MAX_PROMPT_CHARS = env_int("PLAYGROUND_MAX_PROMPT_CHARS", 32_000)
PLAYGROUND_MAX_PROMPT_TOKENS = env_int("PLAYGROUND_MAX_PROMPT_TOKENS", 8_192)
# Messages in one chat: an API request with more is refused; a browser conversation that grew past
# it is rendered from its newest ones (each message costs its template's role markers).
PLAYGROUND_MAX_MESSAGES = env_int("PLAYGROUND_MAX_MESSAGES", 1_000)
PLAYGROUND_MAX_NEW_TOKENS = env_int("PLAYGROUND_MAX_NEW_TOKENS", 2_048)
PLAYGROUND_MAX_CONCURRENT_PER_CLIENT = env_int("PLAYGROUND_MAX_CONCURRENT_PER_CLIENT", 2)
# Generations waiting for a worker, over all clients; more are refused with `server_busy` (0: no bound).
PLAYGROUND_MAX_QUEUED = env_int("PLAYGROUND_MAX_QUEUED", 200)
# Images attached to one message (vision-language models; playground/images.py): how many, the
# bytes of each file and its pixels (checked before the pixels are decoded).
PLAYGROUND_MAX_IMAGES = env_int("PLAYGROUND_MAX_IMAGES", 4)
PLAYGROUND_MAX_IMAGE_BYTES = env_int("PLAYGROUND_MAX_IMAGE_BYTES", 1024 * 1024)
PLAYGROUND_MAX_IMAGE_PIXELS = env_int("PLAYGROUND_MAX_IMAGE_PIXELS", 4096 * 4096)
# One WebSocket message; larger ones are refused (`message_too_large`) and the socket stays
# open. Keep it below daphne's --websocket-max-message-size and --websocket-max-frame-size (16 MiB in
# scripts/run.py, docker-compose.yml and the Dockerfile), past which daphne drops the connection.
# The default leaves room for the images' base64 (4/3 of their bytes) beside 512 KiB of text.
PLAYGROUND_MAX_MESSAGE_BYTES = env_int(
    "PLAYGROUND_MAX_MESSAGE_BYTES", 512 * 1024 + PLAYGROUND_MAX_IMAGES * PLAYGROUND_MAX_IMAGE_BYTES * 4 // 3 + 4096
)
# Continuous batching, per worker process: how many generations share its engine's steps (also
# the Celery thread pool's size), and the paged KV pool they share (its full blocks are the
# prefix cache of the batched requests).
PLAYGROUND_WORKER_SLOTS = env_int("PLAYGROUND_WORKER_SLOTS", 16)
PLAYGROUND_KV_CACHE_MB = env_int("PLAYGROUND_KV_CACHE_MB", 512)
PLAYGROUND_MAX_BATCHED_TOKENS = env_int("PLAYGROUND_MAX_BATCHED_TOKENS", 512)
# A step that prefills is kept near this many milliseconds (fewer tokens when one costs more), so
# one user's long prompts delay another's first token by about two steps, not by the whole
# prompt (docs/continuous-batching.md, "Fair sharing"). 0: the token budget alone.
PLAYGROUND_MAX_STEP_MS = env_int("PLAYGROUND_MAX_STEP_MS", 500)

# Liveness (playground/coord/liveness.py, beacon.py): a worker's beacon, a child process of its
# own, refreshes a per-generation key every HEARTBEAT_INTERVAL; the key lives HEARTBEAT_TTL, so a
# missing key means the worker process (or its host) is gone. The beacon deletes the keys when the
# process ends; the TTL says it for a host cut off from Redis, and is far above a loaded machine's
# longest gap between two beats (docs/reliability.md: 1 s measured). A worker that runs no Python
# for WORKER_STALL (wedged, far longer than any model load) is let go silent, and its generations
# are then lost.
PLAYGROUND_HEARTBEAT_INTERVAL_S = env_float("PLAYGROUND_HEARTBEAT_INTERVAL_S", 1.0)
PLAYGROUND_HEARTBEAT_TTL_S = env_float("PLAYGROUND_HEARTBEAT_TTL_S", 10.0)
PLAYGROUND_WORKER_STALL_S = env_float("PLAYGROUND_WORKER_STALL_S", 900.0)
# A queued generation is declared lost only when no worker at all is alive this long after
# it was queued: a busy worker may take minutes to reach it.
PLAYGROUND_QUEUE_TIMEOUT_S = env_int("PLAYGROUND_QUEUE_TIMEOUT_S", 15)
# The OpenAI-compatible API (/v1/) answers local clients without a key (make run); keys: the admin.
PLAYGROUND_API_KEYLESS_LOCALHOST = env_bool("PLAYGROUND_API_KEYLESS_LOCALHOST", True)
# One API client's generations running at once (the keyless local client, and keys without a
# value of their own): by default one worker's batch. More wait for their turn, in order, up to
# API_MAX_WAITING more per client; beyond that the client gets 429 (see playground/web/openai_api/turns.py).
PLAYGROUND_API_MAX_CONCURRENT = env_int("PLAYGROUND_API_MAX_CONCURRENT", PLAYGROUND_WORKER_SLOTS)
PLAYGROUND_API_MAX_WAITING = env_int("PLAYGROUND_API_MAX_WAITING", 64)
if PLAYGROUND_API_MAX_CONCURRENT < 1 or PLAYGROUND_API_MAX_WAITING < 0:
    raise ValueError(
        f"PLAYGROUND_API_MAX_CONCURRENT={PLAYGROUND_API_MAX_CONCURRENT} must be >= 1 and "
        f"PLAYGROUND_API_MAX_WAITING={PLAYGROUND_API_MAX_WAITING} >= 0"
    )

# Prefill/decode disaggregation (see docs/pd-disaggregation.md): "colocated" (one worker does
# both) or "disaggregated" (queue "prefill", then queue "decode"); a request's "pd" field wins.
# The KV cache travels through Redis or a directory every worker mounts ("file:/path") and
# expires after KV_TTL seconds if no decode worker takes it.
PLAYGROUND_PD_MODE = os.environ.get("PLAYGROUND_PD_MODE", "colocated")
if PLAYGROUND_PD_MODE not in ("colocated", "disaggregated"):
    raise ValueError(f"PLAYGROUND_PD_MODE={PLAYGROUND_PD_MODE!r} must be 'colocated' or 'disaggregated'")
PLAYGROUND_KV_STORE = os.environ.get("PLAYGROUND_KV_STORE", "redis")
PLAYGROUND_KV_TTL_S = env_int("PLAYGROUND_KV_TTL_S", 120)

SECRET_KEY = load_secret_key(PLAYGROUND_DATA_DIR)
# Off unless asked for (`DEBUG=1`, `make dev`): Django's debug pages name the settings and the
# source paths to whoever gets an error. Without it, static files come from collectstatic.
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")
# Pages allowed to open the WebSocket (scheme://host[:port], compared exactly; see
# playground/web/origin.py). Empty: only the origin the socket is opened at, for ALLOWED_HOSTS.
PLAYGROUND_ALLOWED_ORIGINS = env_list("PLAYGROUND_ALLOWED_ORIGINS", "")
for _origin in PLAYGROUND_ALLOWED_ORIGINS:
    if not _origin.startswith(("http://", "https://")) or _origin.rstrip("/").count("/") != 2:
        raise ValueError(
            f"PLAYGROUND_ALLOWED_ORIGINS: {_origin!r} must be scheme://host[:port], e.g. https://chat.example"
        )

INSTALLED_APPS = [
    "daphne",  # first: its runserver serves ASGI (WebSockets) too
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "playground",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "playground.web.middleware.ContentSecurityPolicyMiddleware",
    "playground.web.middleware.ApiErrorMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # After the session and the user: a stored choice wins over the browser's Accept-Language.
    "playground.web.language.LanguageMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "playground.urls"
ASGI_APPLICATION = "playground.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{PLAYGROUND_DATA_DIR / 'db.sqlite3'}",
    ),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    PLAYGROUND_DATA_DIR.mkdir(parents=True, exist_ok=True)
    # The web process and the worker write concurrently: WAL lets readers proceed during a
    # write, IMMEDIATE takes the write lock up front instead of failing on upgrade. With WAL,
    # synchronous=NORMAL syncs at checkpoints, not at each commit (a crashed process loses
    # nothing; a power cut, the last commits): 16 streams' saves waited on fsync in turn.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # The database on another host (docs/running.md, "Several machines"): connecting to one that
    # cannot be reached fails after 10 s, and a connection whose peer went silent (a cut link, a
    # dead host) errors within about 30 s, instead of TCP's defaults (minutes to hours of a
    # thread stuck in a query); the next query then connects again.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "connect_timeout": 10,
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            "tcp_user_timeout": 30_000,
        }
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "playground.coord.layer.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    },
}

CELERY_BROKER_URL = REDIS_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker whose Redis is gone keeps trying to reconnect (Celery's default gives up after 100
# tries and the worker exits); see also scripts/worker.py's RECONNECT_OPTIONS.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# kombu's Redis transport with channels that can close after Redis died mid-task: without it the
# worker exited instead of reconnecting (playground/broker.py says why). `rediss://` keeps kombu's
# own transport: naming a class would skip kombu's TLS set-up for that scheme.
CELERY_BROKER_TRANSPORT = "playground.broker:Transport" if REDIS_URL.startswith("redis://") else None
CELERY_TASK_IGNORE_RESULT = True  # results travel over the channel layer and the DB
CELERY_TASK_ROUTES = {
    "playground.tasks.run_generation": {"queue": "gpu"},
    "playground.tasks.run_choices": {"queue": "gpu"},
    "playground.tasks.run_prefill": {"queue": "prefill"},
    "playground.tasks.run_decode": {"queue": "decode"},
}
# One generation per worker at a time, acknowledged when done: a second task never waits
# behind a long generation while another worker is idle.
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# The two languages of every page, the admin and the JavaScript (docs/ui.md, "Languages"): taken
# from the browser (Accept-Language) until the person picks one, which is kept per user
# (playground/web/language.py). Catalogs: locale/<lang>/LC_MESSAGES/, compiled .mo committed.
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
LANGUAGE_COOKIE_AGE = 60 * 60 * 24 * 365
LANGUAGE_COOKIE_SAMESITE = "Lax"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedStaticFilesStorage",
    },
}
# In DEBUG, serve straight from static/ (no collectstatic) under daphne too; also where
# collectstatic never ran (scripts/run.py started without `make run`, the tests), rather than 404s.
WHITENOISE_USE_FINDERS = WHITENOISE_AUTOREFRESH = DEBUG or not STATIC_ROOT.is_dir()

CSRF_FAILURE_VIEW = "playground.web.endpoints.csrf_failure"
# Every response (see playground/web/middleware.py): nothing inline, nothing from elsewhere;
# images from this origin or data: URLs only (model output never loads one: markdown.js).
PLAYGROUND_CSP = os.environ.get(
    "PLAYGROUND_CSP",
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self' {ws_origin}; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'",
)
SESSION_COOKIE_AGE = 60 * 60 * 24 * 365  # conversations belong to the session: keep it a year
# The session cookie: never readable by scripts, not sent with cross-site subrequests or posts
# (Lax keeps it on a link followed from elsewhere, so the browser keeps its conversations).
# PLAYGROUND_HTTPS=1 when the site is served over HTTPS (itself, or by a proxy that sets
# X-Forwarded-Proto: https and strips a client's own): the cookies then only travel over TLS,
# and Django believes the proxy's header about the scheme.
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"  # not HttpOnly: the page's scripts send its value as X-CSRFToken
PLAYGROUND_HTTPS = env_bool("PLAYGROUND_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = PLAYGROUND_HTTPS
if PLAYGROUND_HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "playground": {"level": os.environ.get("PLAYGROUND_LOG_LEVEL", "INFO")},
        "inference": {"level": os.environ.get("PLAYGROUND_LOG_LEVEL", "INFO")},
    },
}
