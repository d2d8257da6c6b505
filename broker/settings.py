"""Django settings, all read from the environment (see docs/configuration.md)."""

from __future__ import annotations

from pathlib import Path

from broker.conf import DEFAULTS
from broker.env import (
    database_conn_max_age,
    database_pool,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_int_list,
    env_list,
    env_secret,
    env_secret_list,
    env_str,
    parse_database_url,
)
from broker.gateway_auth import check_mode as check_gateway_mode
from broker.logs import LOG_FORMATS, logging_config

# What the broker writes (payload files, collected static files, like the default SQLite file) goes
# under the directory it runs in, never into the installed package.
DATA_DIR = Path.cwd()

# Flagged by `manage.py check --deploy` (security.W009) because of its prefix: never run with it.
INSECURE_DEFAULT_SECRET_KEY = "django-insecure-webhook-broker-development-key-do-not-deploy"  # noqa: S105
SECRET_KEY = env_secret("DJANGO_SECRET_KEY", INSECURE_DEFAULT_SECRET_KEY)
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# Behind TLS (directly or via a proxy that sets X-Forwarded-Proto): secure cookies, HTTPS redirect
# and HSTS. Off by default so a first run over plain HTTP on localhost works.
DJANGO_HTTPS = env_bool("DJANGO_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_SSL_REDIRECT = DJANGO_HTTPS
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31536000 if DJANGO_HTTPS else 0, minimum=0)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if DJANGO_HTTPS else None
# /_status must answer plain HTTP health probes even when everything else redirects to HTTPS.
SECURE_REDIRECT_EXEMPT = [r"^_status$"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "broker",
    "consumers",
    "jobs",
    "django_q",
]

MIDDLEWARE = [
    "broker.request_ids.RequestIdMiddleware",
    "broker.gateway_auth.GatewayAuthMiddleware",  # before any other work (no-op unless enabled)
    "django.middleware.security.SecurityMiddleware",
    "broker.ui.csp.ContentSecurityPolicyMiddleware",  # the operator UI's pages and the admin login
    "broker.api.errors.DatabaseUnavailableMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "broker.urls"
WSGI_APPLICATION = "broker.wsgi.application"
ASGI_APPLICATION = "broker.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],  # the broker app's own: broker/templates (a link to templates/ in a checkout)
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

DATABASES = {
    "default": {
        **parse_database_url(env_str("DATABASE_URL", "sqlite:///broker.sqlite3")),
        "CONN_HEALTH_CHECKS": True,
    }
}
# PostgreSQL: a connection pool per process, so that a process holds a bounded number of
# connections whatever its threads do. Without it every thread keeps a connection of its own,
# and `manage.py runserver`, a thread per HTTP connection, ran the server out of connections
# ("too many clients", issue 14). See docs/configuration.md.
_pool = database_pool(DATABASES["default"]["ENGINE"])
if _pool:
    DATABASES["default"]["OPTIONS"]["pool"] = _pool
DATABASES["default"]["CONN_MAX_AGE"] = database_conn_max_age(pooled=_pool is not None)
if DATABASES["default"]["ENGINE"].endswith("postgresql") and env_bool(
    "DATABASE_PREPARED_STATEMENTS", True
):
    # Server-side binding with prepared statements: PostgreSQL plans a statement a connection
    # repeats (publishing above all) once instead of on every request. The pool above hands out
    # whole sessions, so they survive there; turn off behind an external pooler in transaction
    # mode (PgBouncer) that cannot carry prepared statements.
    DATABASES["default"]["OPTIONS"].update(server_side_binding=True, prepare_threshold=5)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# Offloaded payloads (SPEC §6.7) go to STORAGES[BROKER_PAYLOAD_STORAGE]: by default files under
# BROKER_PAYLOAD_DIR, which every web and dispatcher process must share. For S3 and the like,
# replace the "broker_payloads" entry in a settings module of your own (docs/configuration.md).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "broker_payloads": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {
            "location": env_str("BROKER_PAYLOAD_DIR", str(DATA_DIR / "payloads")),
            # Payloads are the producers' data: readable by the broker's own user alone.
            "file_permissions_mode": 0o600,
            "directory_permissions_mode": 0o700,
        },
    },
}

STATIC_URL = "static/"
STATIC_ROOT = Path(env_str("DJANGO_STATIC_ROOT", str(DATA_DIR / "staticfiles")))
# WhiteNoise serves static files from the app itself, so the admin looks right under gunicorn with
# no web server in front. Finders let a first run work before `collectstatic`.
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "broker.api.auth.AdminTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["broker.api.auth.IsBrokerAdmin"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.FormParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "broker.api.negotiation.SingleRendererFirst",
    "EXCEPTION_HANDLER": "broker.api.errors.handle_exception",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Webhook broker API",
    "DESCRIPTION": "webhook-broker compatible REST API, with extensions. See docs/api.md.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SWAGGER_UI_DIST": "SIDECAR",  # served from this app: no CDN at run time
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "broker.api.schema.add_error_responses",
    ],
}

# Text lines (default) or one JSON object a line, to standard error (docs/observability.md).
BROKER_LOG_FORMAT = env_choice("BROKER_LOG_FORMAT", "text", LOG_FORMATS)
LOGGING = logging_config(BROKER_LOG_FORMAT, env_str("DJANGO_LOG_LEVEL", "INFO").upper())

# --- Broker settings (names from SPEC §10; defaults and meaning in broker/conf.py and
# docs/configuration.md). Code reads them through broker.conf.broker_settings at call time.
BROKER_ADMIN_TOKENS = env_secret_list("BROKER_ADMIN_TOKENS")
BROKER_OPEN_ADMIN_API = env_bool("BROKER_OPEN_ADMIN_API", DEFAULTS["BROKER_OPEN_ADMIN_API"])
BROKER_PUBLIC_STATUS = env_bool("BROKER_PUBLIC_STATUS", DEFAULTS["BROKER_PUBLIC_STATUS"])
BROKER_PUBLIC_METRICS = env_bool("BROKER_PUBLIC_METRICS", DEFAULTS["BROKER_PUBLIC_METRICS"])
BROKER_ALLOW_PRIVATE_CALLBACKS = env_bool(
    "BROKER_ALLOW_PRIVATE_CALLBACKS", DEFAULTS["BROKER_ALLOW_PRIVATE_CALLBACKS"]
)
BROKER_DELIVERY_TIMEOUT_SECONDS = env_int(
    "BROKER_DELIVERY_TIMEOUT_SECONDS", DEFAULTS["BROKER_DELIVERY_TIMEOUT_SECONDS"], minimum=1
)
BROKER_CONSUMER_TOKEN_HEADER = env_str(
    "BROKER_CONSUMER_TOKEN_HEADER", DEFAULTS["BROKER_CONSUMER_TOKEN_HEADER"]
)
BROKER_RATIONAL_DELAY_SECONDS = env_int(
    "BROKER_RATIONAL_DELAY_SECONDS", DEFAULTS["BROKER_RATIONAL_DELAY_SECONDS"], minimum=0
)
BROKER_RETRY_DELAYS = env_int_list("BROKER_RETRY_DELAYS", DEFAULTS["BROKER_RETRY_DELAYS"])
BROKER_RETRY_JITTER = env_float(
    "BROKER_RETRY_JITTER", DEFAULTS["BROKER_RETRY_JITTER"], minimum=0.0, maximum=1.0
)
BROKER_CIRCUIT_FAILURE_THRESHOLD = env_int(
    "BROKER_CIRCUIT_FAILURE_THRESHOLD", DEFAULTS["BROKER_CIRCUIT_FAILURE_THRESHOLD"], minimum=0
)
BROKER_CIRCUIT_COOLDOWN_SECONDS = env_int(
    "BROKER_CIRCUIT_COOLDOWN_SECONDS", DEFAULTS["BROKER_CIRCUIT_COOLDOWN_SECONDS"], minimum=1
)
BROKER_MAX_JOB_AGE_SECONDS = env_int(
    "BROKER_MAX_JOB_AGE_SECONDS", DEFAULTS["BROKER_MAX_JOB_AGE_SECONDS"], minimum=0
)
BROKER_MIN_SCHEDULE_DELAY_SECONDS = env_int(
    "BROKER_MIN_SCHEDULE_DELAY_SECONDS", DEFAULTS["BROKER_MIN_SCHEDULE_DELAY_SECONDS"], minimum=0
)
BROKER_PAYLOAD_OFFLOAD_BYTES = env_int(
    "BROKER_PAYLOAD_OFFLOAD_BYTES", DEFAULTS["BROKER_PAYLOAD_OFFLOAD_BYTES"], minimum=1
)
BROKER_MAX_PAYLOAD_BYTES = env_int(
    "BROKER_MAX_PAYLOAD_BYTES", DEFAULTS["BROKER_MAX_PAYLOAD_BYTES"], minimum=1
)
BROKER_PAYLOAD_STORAGE = env_str("BROKER_PAYLOAD_STORAGE", DEFAULTS["BROKER_PAYLOAD_STORAGE"])
BROKER_ENCRYPTION_KEYS = env_secret_list("BROKER_ENCRYPTION_KEYS")
BROKER_RETENTION_DAYS = env_int(
    "BROKER_RETENTION_DAYS", DEFAULTS["BROKER_RETENTION_DAYS"], minimum=0
)
BROKER_BROADCAST_RATE_LIMIT = env_float(
    "BROKER_BROADCAST_RATE_LIMIT", DEFAULTS["BROKER_BROADCAST_RATE_LIMIT"], minimum=0.0, maximum=1e6
)
BROKER_BROADCAST_BURST = env_int(
    "BROKER_BROADCAST_BURST", DEFAULTS["BROKER_BROADCAST_BURST"], minimum=0
)
BROKER_GATEWAY_AUTH_MODE = (
    env_str("BROKER_GATEWAY_AUTH_MODE", DEFAULTS["BROKER_GATEWAY_AUTH_MODE"]).strip().lower()
)
BROKER_GATEWAY_HMAC_SECRET = env_secret(
    "BROKER_GATEWAY_HMAC_SECRET", DEFAULTS["BROKER_GATEWAY_HMAC_SECRET"]
)
check_gateway_mode(BROKER_GATEWAY_AUTH_MODE, BROKER_GATEWAY_HMAC_SECRET)
BROKER_GATEWAY_HMAC_TOLERANCE_SECONDS = env_int(
    "BROKER_GATEWAY_HMAC_TOLERANCE_SECONDS",
    DEFAULTS["BROKER_GATEWAY_HMAC_TOLERANCE_SECONDS"],
    minimum=1,
)
BROKER_GATEWAY_AUTH_EXEMPT_PATHS = env_list(
    "BROKER_GATEWAY_AUTH_EXEMPT_PATHS", DEFAULTS["BROKER_GATEWAY_AUTH_EXEMPT_PATHS"]
)

# Housekeeping runs as django-q2 schedules (`manage.py qcluster`, docs/housekeeping.md) with the
# ORM broker: the database is the queue, so there is nothing else to run. Tasks are short and
# rare: one worker; a task may take 10 minutes before it is retried (retry > timeout, as
# django-q2 requires); missed runs after downtime run once, not once per missed period.
Q_CLUSTER = {
    "name": "broker-housekeeping",
    "orm": "default",
    "workers": env_int("BROKER_HOUSEKEEPING_WORKERS", 1, minimum=1),
    "timeout": 600,
    "retry": 900,
    "max_attempts": 3,
    "catch_up": False,
    "save_limit": 250,
    "ack_failures": True,
}
# Let request bodies up to the payload limit through, so broadcast can answer 413 itself.
DATA_UPLOAD_MAX_MEMORY_SIZE = BROKER_MAX_PAYLOAD_BYTES + 65536
