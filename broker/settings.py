"""Django settings, all read from the environment (see docs/configuration.md)."""

from __future__ import annotations

import os
from pathlib import Path

from broker import embedded_postgres
from broker.env import READ_REPLICA, database_settings, read_replica_settings
from broker.gateway_auth import check_mode as check_gateway_mode
from broker.logs import logging_config
from broker.settings_catalog import BrokerSettings, ServerEnvironment

# Every variable below is declared, with its type, default and bounds, in
# broker/settings_catalog/; a bad value raises ConfigError there, which manage.py and the
# WSGI/ASGI modules turn into one line.
_env = ServerEnvironment.from_environment(os.environ)

# What the broker writes (payload files, collected static files, the embedded PostgreSQL's data)
# goes under the directory it runs in, never into the installed package.
DATA_DIR = Path.cwd()

SECRET_KEY = _env.DJANGO_SECRET_KEY
DEBUG = _env.DJANGO_DEBUG
ALLOWED_HOSTS = _env.DJANGO_ALLOWED_HOSTS
CSRF_TRUSTED_ORIGINS = _env.DJANGO_CSRF_TRUSTED_ORIGINS
# A form refused for its CSRF token: a page in the UI's layout under /ui/ (docs/ui.md).
CSRF_FAILURE_VIEW = "broker.ui.error_pages.csrf_failure"

# Behind TLS (directly or via a proxy that sets X-Forwarded-Proto): secure cookies, HTTPS redirect
# and HSTS. Off by default so a first run over plain HTTP on localhost works.
DJANGO_HTTPS = _env.DJANGO_HTTPS
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_SSL_REDIRECT = DJANGO_HTTPS
SECURE_HSTS_SECONDS = _env.DJANGO_HSTS_SECONDS
if SECURE_HSTS_SECONDS is None:
    SECURE_HSTS_SECONDS = 31536000 if DJANGO_HTTPS else 0
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

# Without DATABASE_URL, the store is the embedded PostgreSQL server of postgres/ in DATA_DIR
# (broker/embedded_postgres.py): `manage.py runbroker` starts it and gives its URL to its
# processes; other commands use it while it runs, and the check broker.E003 says how to start it
# when it does not.
EMBEDDED_POSTGRES_DIR = None if _env.DATABASE_URL else DATA_DIR / "postgres"
_database_url = _env.DATABASE_URL
if EMBEDDED_POSTGRES_DIR is not None:
    _database_url = embedded_postgres.url_for_settings(EMBEDDED_POSTGRES_DIR)
# The store, with its connection pool, prepared statements and JIT off on PostgreSQL
# (broker/env.py, docs/configuration.md).
DATABASES = {"default": database_settings(_database_url)}
if _env.BROKER_READ_DATABASE_URL:
    # Reads that may be a moment old go to a streaming replica: the router sends a request's
    # reads there when the middleware has marked the request as one that only reads
    # (broker/db_routing.py, docs/configuration.md#read-replica). Without it, one database.
    DATABASES[READ_REPLICA] = read_replica_settings(_env.BROKER_READ_DATABASE_URL)
    DATABASE_ROUTERS = ["broker.db_routing.ReadReplicaRouter"]
    MIDDLEWARE.append("broker.db_routing.ReplicaReadMiddleware")
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

# Offloaded payloads (docs/delivery.md, "Large payloads") go to STORAGES[BROKER_PAYLOAD_STORAGE]: by
# default files under BROKER_PAYLOAD_DIR, which every web and dispatcher process must share. For S3
# and the like, replace the "broker_payloads" entry in a settings module of your own
# (docs/configuration.md).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "broker_payloads": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {
            "location": _env.BROKER_PAYLOAD_DIR or str(DATA_DIR / "payloads"),
            # Payloads are the producers' data: readable by the broker's own user alone.
            "file_permissions_mode": 0o600,
            "directory_permissions_mode": 0o700,
        },
    },
}

STATIC_URL = "static/"
STATIC_ROOT = Path(_env.DJANGO_STATIC_ROOT or DATA_DIR / "staticfiles")
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
    "DEFAULT_SCHEMA_CLASS": "broker.api.schema.BrokerAutoSchema",
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
    ],
}

# Text lines (default) or one JSON object a line, to standard error (docs/observability.md).
BROKER_LOG_FORMAT = _env.BROKER_LOG_FORMAT
LOGGING = logging_config(BROKER_LOG_FORMAT, _env.DJANGO_LOG_LEVEL.upper())

# --- Broker settings (names from docs/configuration.md; defaults and meaning in broker/conf.py and
# docs/configuration.md). Code reads them through broker.conf.broker_settings at call time.
# Each is declared once, in broker.settings_catalog.BrokerSettings, and read here from the
# environment variable of its name.
_broker = BrokerSettings.from_environment(os.environ)
globals().update(_broker.values())
check_gateway_mode(_broker.BROKER_GATEWAY_AUTH_MODE, _broker.BROKER_GATEWAY_HMAC_SECRET)

# Housekeeping runs as django-q2 schedules (`manage.py qcluster`, docs/housekeeping.md) with the
# ORM broker: the database is the queue, so there is nothing else to run. Tasks are short and
# rare: one worker; a task may take 10 minutes before it is retried (retry > timeout, as
# django-q2 requires); missed runs after downtime run once, not once per missed period.
Q_CLUSTER = {
    "name": "broker-housekeeping",
    "orm": "default",
    "workers": _env.BROKER_HOUSEKEEPING_WORKERS,
    "timeout": 600,
    "retry": 900,
    "max_attempts": 3,
    "catch_up": False,
    "save_limit": 250,
    "ack_failures": True,
}
# Let request bodies up to the payload limit through, so broadcast can answer 413 itself.
DATA_UPLOAD_MAX_MEMORY_SIZE = _broker.BROKER_MAX_PAYLOAD_BYTES + 65536
