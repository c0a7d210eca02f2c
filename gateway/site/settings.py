"""Django settings for Leasecast, read from the environment.

With nothing set, Leasecast runs on the embedded default: SQLite under ``var/``
and the in-memory channel layer (design decision 10). ``DATABASE_URL`` selects
PostgreSQL, ``REDIS_URL`` selects ``channels_redis``; ``GATEWAY_*`` variables
set the knobs that ``gateway.conf`` reads (see docs/operations.md).

``GATEWAY_ENV=production`` is the switch for a real deployment: it refuses
to start (``ImproperlyConfigured``) with ``GATEWAY_DEBUG`` on or without a
real ``SECRET_KEY`` from the environment, and turns the per-token limits on
at their production defaults. Unset, it is ``development``: ``make run``'s
embedded default, with a secret key made once under ``var/``.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from gateway.conf import BASE_DIR as BASE_DIR
from gateway.conf import GatewaySettings, environ_settings, var_dir
from gateway.core.leases import DEFAULT_QUEUE_SETTINGS as _QUEUE_DEFAULTS
from gateway.site.database_url import parse_database_url
from gateway.topics.redis_url import layer_host as redis_layer_host

# Lets type hints such as ModelAdmin[Queue] run, not only type-check.
django_stubs_ext.monkeypatch()

# Every GATEWAY_* default is GatewaySettings' (gateway.conf), written there once.
_DEFAULTS = GatewaySettings()
VAR_DIR = var_dir()


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _env_number(name: str, default: float) -> float:
    """A number >= 0 from the environment; a bad value stops the start with its name."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if value < 0:
        raise ImproperlyConfigured(f"{name} must be >= 0 (0 turns the limit off), got {raw!r}")
    return value


# -- environment: development (the embedded default) or production ----------

ENVIRONMENTS = ("development", "production")
GATEWAY_ENV = os.environ.get("GATEWAY_ENV", "").strip().lower() or "development"
if GATEWAY_ENV not in ENVIRONMENTS:
    raise ImproperlyConfigured(
        f"GATEWAY_ENV must be one of {', '.join(ENVIRONMENTS)}, got {GATEWAY_ENV!r}"
    )
PRODUCTION = GATEWAY_ENV == "production"

#: The shortest secret key production accepts (Django's own deploy check asks for 50).
MIN_SECRET_KEY_LENGTH = 50


def _secret_key() -> str:
    """``SECRET_KEY`` from the environment, else (development only) one kept in var/."""
    key = os.environ.get("SECRET_KEY") or os.environ.get("DJANGO_SECRET_KEY") or ""
    if PRODUCTION:
        _check_production_secret_key(key)
        return key
    if key:
        return key
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def _check_production_secret_key(key: str) -> None:
    """Refuse a missing, short, repetitive or Django-generated-insecure key."""
    where = (
        "set SECRET_KEY in the environment, e.g. to the output of "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`"
    )
    if not key:
        raise ImproperlyConfigured(
            f"GATEWAY_ENV=production needs a real secret key: SECRET_KEY is not set ({where})"
        )
    if len(key) < MIN_SECRET_KEY_LENGTH or len(set(key)) < 5 or key.startswith("django-insecure-"):
        raise ImproperlyConfigured(
            f"GATEWAY_ENV=production needs a real secret key: SECRET_KEY must be at least "
            f"{MIN_SECRET_KEY_LENGTH} random characters, not a placeholder ({where})"
        )


SECRET_KEY = _secret_key()
DEBUG = _env_bool("GATEWAY_DEBUG", False)
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured(
        "GATEWAY_ENV=production refuses to start with GATEWAY_DEBUG on: debug pages show "
        "settings and stack frames to anyone. Unset GATEWAY_DEBUG."
    )
_HOSTS = ",".join(_DEFAULTS.allowed_hosts)
ALLOWED_HOSTS = os.environ.get("GATEWAY_ALLOWED_HOSTS", _HOSTS).split(",")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "gateway",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "gateway.site.urls"
ASGI_APPLICATION = "gateway.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# -- storage (design decisions 1-3) -------------------------------------------


def _private_sqlite_file(path: Path) -> None:
    """Make the SQLite file readable by its owner only (it holds session keys).

    Created 0600 before any connection opens it (SQLite creates its WAL and
    shared-memory files with the database file's mode); an existing file, and
    companions of it, left readable by others are tightened.

    Raises:
        ImproperlyConfigured: the file cannot be created or its mode changed.
    """
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        for companion in ("", "-wal", "-shm", "-journal"):
            file = path.with_name(path.name + companion)
            if file.exists() and file.stat().st_mode & 0o077:
                file.chmod(0o600)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"cannot make the SQLite database {path} private (mode 0600): {exc}"
        ) from exc


if os.environ.get("DATABASE_URL"):
    # Also libpq's multi-host form: a primary and its standby (gateway.site.database_url).
    DATABASES = {"default": parse_database_url(os.environ["DATABASE_URL"], conn_max_age=0)}
else:
    _sqlite_path = Path(os.environ.get("GATEWAY_SQLITE_PATH", VAR_DIR / "leasecast.sqlite3"))
    _sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    _private_sqlite_file(_sqlite_path)
    _synchronous = os.environ.get("GATEWAY_SQLITE_SYNCHRONOUS", "NORMAL")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(_sqlite_path),
            "OPTIONS": {
                # WAL: readers never block the writer. synchronous=NORMAL in WAL
                # mode survives a crash of the process (kill -9); FULL also
                # survives a power cut, at a cost (docs/operations.md).
                # A 64 MiB page cache (the default is 2 MiB) keeps a queue with a
                # large backlog in memory.
                "init_command": (
                    f"PRAGMA journal_mode=WAL; PRAGMA synchronous={_synchronous}; "
                    "PRAGMA cache_size=-65536;"
                ),
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# -- channel layer (design decision 7) ------------------------------------------

if os.environ.get("REDIS_URL"):
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # Room for bursts between processes; what overflows is detected
            # as a gap and handled (gateway.relay).
            "CONFIG": {
                # A redis+sentinel:// URL becomes channels_redis's Sentinel entry.
                "hosts": [redis_layer_host(os.environ["REDIS_URL"])],
                "capacity": int(os.environ.get("GATEWAY_REDIS_CAPACITY", 10_000)),
                "expiry": 30,
                "prefix": os.environ.get("GATEWAY_REDIS_PREFIX", _DEFAULTS.redis_prefix),
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# -- web --------------------------------------------------------------------

# Django's four password validators in production (the admin's passwords);
# development keeps `make run`'s short dev password possible.
AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = (
    [
        {"NAME": f"django.contrib.auth.password_validation.{name}"}
        for name in (
            "UserAttributeSimilarityValidator",
            "MinimumLengthValidator",
            "CommonPasswordValidator",
            "NumericPasswordValidator",
        )
    ]
    if PRODUCTION
    else []
)
# Password logins throttled per user name and client address (gateway.login_throttle).
AUTHENTICATION_BACKENDS = ["gateway.login_throttle.ThrottledModelBackend"]
GATEWAY_LOGIN_FAILURES = int(_env_number("GATEWAY_LOGIN_FAILURES", 5))
GATEWAY_LOGIN_LOCKOUT = _env_number("GATEWAY_LOGIN_LOCKOUT", 300.0)
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
LOGIN_URL = "/admin/login/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        # Not propagated: daphne's command line gives the root logger a
        # handler too (logging.basicConfig), which printed every line twice.
        "leasecast": {
            "handlers": ["console"],
            "level": os.environ.get("GATEWAY_LOG_LEVEL", "INFO"),
            "propagate": False,
        }
    },
}

# -- gateway knobs (read through gateway.conf.GatewaySettings) -----------------

GATEWAY_MAX_BODY_BYTES = int(os.environ.get("GATEWAY_MAX_BODY_BYTES", _DEFAULTS.max_body_bytes))
GATEWAY_MAX_FRAME_BYTES = int(os.environ.get("GATEWAY_MAX_FRAME_BYTES", _DEFAULTS.max_frame_bytes))
# Django's own cap on a request body is the gateway's request limit: the server
# refuses more while it arrives; the API answers 413 in JSON for the rest.
DATA_UPLOAD_MAX_MEMORY_SIZE = environ_settings().max_request_bytes
GATEWAY_BATCH_MAX_OPS = int(os.environ.get("GATEWAY_BATCH_MAX_OPS", _DEFAULTS.batch_max_ops))
GATEWAY_MAX_BACKLOG = int(os.environ.get("GATEWAY_MAX_BACKLOG", _DEFAULTS.max_backlog))
GATEWAY_QUEUE_SETTINGS_TTL = float(
    os.environ.get("GATEWAY_QUEUE_SETTINGS_TTL", _DEFAULTS.queue_settings_ttl)
)
GATEWAY_TOKEN_CACHE_TTL = float(
    os.environ.get("GATEWAY_TOKEN_CACHE_TTL", _DEFAULTS.token_cache_ttl)
)
# Defaults of queues created on first use; the protocol's values live in
# gateway.core.leases.DEFAULT_QUEUE_SETTINGS, the only copy of them.
GATEWAY_DEFAULT_VISIBILITY_TIMEOUT = float(
    os.environ.get("GATEWAY_DEFAULT_VISIBILITY_TIMEOUT", _QUEUE_DEFAULTS.visibility_timeout)
)
GATEWAY_DEFAULT_MAX_DELIVERIES = int(
    os.environ.get("GATEWAY_DEFAULT_MAX_DELIVERIES", _QUEUE_DEFAULTS.max_deliveries)
)
GATEWAY_DEFAULT_DEDUP_WINDOW = float(
    os.environ.get("GATEWAY_DEFAULT_DEDUP_WINDOW", _QUEUE_DEFAULTS.dedup_window)
)
GATEWAY_SERVE_STATIC = _env_bool("GATEWAY_SERVE_STATIC", _DEFAULTS.serve_static)
# GET /metrics without a token (docs/operations.md, Metrics).
GATEWAY_METRICS_PUBLIC = _env_bool("GATEWAY_METRICS_PUBLIC", _DEFAULTS.metrics_public)
GATEWAY_BLOCK_WAIT = float(os.environ.get("GATEWAY_BLOCK_WAIT", _DEFAULTS.block_wait))
# A topic with no subscriber on a process and no publish for this long is forgotten there.
GATEWAY_TOPIC_IDLE = float(os.environ.get("GATEWAY_TOPIC_IDLE", _DEFAULTS.topic_idle))
GATEWAY_TOPIC_LIMIT = int(os.environ.get("GATEWAY_TOPIC_LIMIT", _DEFAULTS.topic_limit))
# Subscriptions one multiplexed socket (/ws/) may hold.
GATEWAY_MAX_SUBSCRIPTIONS = int(
    os.environ.get("GATEWAY_MAX_SUBSCRIPTIONS", _DEFAULTS.max_subscriptions)
)
# Seconds between the keep-alive comments of an idle event stream (/sse/), <= 15.
GATEWAY_SSE_KEEPALIVE = float(os.environ.get("GATEWAY_SSE_KEEPALIVE", _DEFAULTS.sse_keepalive))
GATEWAY_GC_THRESHOLD = int(os.environ.get("GATEWAY_GC_THRESHOLD", _DEFAULTS.gc_threshold))
# Topic offsets, history and the relay between processes live in this Redis
# (gateway.topics.streams); unset, in the one process.
REDIS_URL = os.environ.get("REDIS_URL", "")
GATEWAY_REDIS_PREFIX = os.environ.get("GATEWAY_REDIS_PREFIX", _DEFAULTS.redis_prefix)
# Messages each topic's Redis stream keeps at least, for processes catching up.
GATEWAY_TOPIC_RELAY_WINDOW = int(
    os.environ.get("GATEWAY_TOPIC_RELAY_WINDOW", _DEFAULTS.topic_relay_window)
)
# Seconds a finished django.tasks result is kept (gateway.tasks), default 7 days.
GATEWAY_TASK_RESULT_RETENTION = float(
    os.environ.get("GATEWAY_TASK_RESULT_RETENTION", _DEFAULTS.task_result_retention)
)

# -- access control (docs/operations.md, Security) -----------------------------

# Browser sockets (authenticated by the session cookie) must come from the
# page's own origin (Origin matches Host, and Host is in ALLOWED_HOSTS) or
# from one of these exact origins, e.g. "https://ops.example.com".
GATEWAY_ALLOWED_ORIGINS = [
    origin.strip().rstrip("/").lower()
    for origin in os.environ.get("GATEWAY_ALLOWED_ORIGINS", "").split(",")
    if origin.strip()
]
# Cross-site request forgery: origins whose pages may post to the admin and
# the API with the session (a proxy that rewrites Host); default the ones above.
CSRF_TRUSTED_ORIGINS = [
    origin.strip().rstrip("/")
    for origin in os.environ.get(
        "GATEWAY_CSRF_TRUSTED_ORIGINS", ",".join(GATEWAY_ALLOWED_ORIGINS)
    ).split(",")
    if origin.strip()
]


def _proxy_ssl_header(name: str) -> tuple[str, str] | None:
    """``SECURE_PROXY_SSL_HEADER`` for the header a TLS proxy sets (``X-Forwarded-Proto``)."""
    name = name.strip()
    if not name:
        return None
    if not re.fullmatch(r"[A-Za-z0-9-]+", name):
        raise ImproperlyConfigured(
            f"GATEWAY_PROXY_SSL_HEADER must be a header name such as X-Forwarded-Proto, "
            f"got {name!r}"
        )
    return ("HTTP_" + name.upper().replace("-", "_"), "https")


# HTTPS: on in production. Secure cookies, HSTS, and pages (not the API,
# /healthz or /metrics, which programs inside the network may call over
# plain HTTP) redirected to https. Behind a proxy that ends TLS, name the
# header it sets (its value must be "https"), or every page redirects to itself.
GATEWAY_HTTPS = _env_bool("GATEWAY_HTTPS", PRODUCTION)
SECURE_PROXY_SSL_HEADER = _proxy_ssl_header(os.environ.get("GATEWAY_PROXY_SSL_HEADER", ""))
if GATEWAY_HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$", r"^api/"]
    SECURE_HSTS_SECONDS = int(_env_number("GATEWAY_HSTS_SECONDS", 365 * 24 * 3600))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("GATEWAY_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = _env_bool("GATEWAY_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        # Preloading is a commitment the site's owner makes by submitting the
        # domain to the browsers' list, not a default to warn about.
        SILENCED_SYSTEM_CHECKS = ["security.W021"]

# Per-token limits on each gateway process; 0 turns one off. Off in
# development (tests and benchmarks run one token at full speed); on in
# production at these defaults unless set.
GATEWAY_TOKEN_MAX_SOCKETS = int(_env_number("GATEWAY_TOKEN_MAX_SOCKETS", 1000 if PRODUCTION else 0))
GATEWAY_TOKEN_RATE = _env_number("GATEWAY_TOKEN_RATE", 20_000.0 if PRODUCTION else 0.0)
# 0: two seconds of the rate
GATEWAY_TOKEN_BURST = _env_number("GATEWAY_TOKEN_BURST", _DEFAULTS.token_limits.burst)
# Signed tokens (JWT HS256, gateway.tokens): the key, shared with the application
# that mints them. Unset: signed tokens are refused.
GATEWAY_SIGNING_KEY = os.environ.get("GATEWAY_SIGNING_KEY", "")
# The longest a signed token may still live when used (seconds, a day; 0: no
# maximum), and the audience and issuer it must carry (unset: not looked at).
GATEWAY_SIGNING_MAX_TTL = _env_number("GATEWAY_SIGNING_MAX_TTL", _DEFAULTS.signing_max_ttl)
GATEWAY_SIGNING_AUDIENCE = os.environ.get("GATEWAY_SIGNING_AUDIENCE", "")
GATEWAY_SIGNING_ISSUER = os.environ.get("GATEWAY_SIGNING_ISSUER", "")
# Seconds between each process's checks for revoked stored tokens of its sockets.
GATEWAY_TOKEN_CHECK_INTERVAL = _env_number(
    "GATEWAY_TOKEN_CHECK_INTERVAL", _DEFAULTS.token_check_interval
)
# Seconds a queue's oldest visible message may wait before the dashboard lists it.
GATEWAY_DASHBOARD_OLDEST_ALERT = _env_number(
    "GATEWAY_DASHBOARD_OLDEST_ALERT", _DEFAULTS.dashboard_oldest_alert
)
