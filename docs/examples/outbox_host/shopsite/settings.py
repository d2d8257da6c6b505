"""Settings of the example shop: a Django project that publishes through the broker's outbox.

Only what the outbox needs. The broker's apps come from `pip install` of the broker; its
`BROKER_*` settings are ordinary Django settings here, with their defaults in `broker/conf.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

from broker.env import parse_database_url

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "django-insecure-example-shop-do-not-deploy")
DEBUG = False
ALLOWED_HOSTS: list[str] = []

INSTALLED_APPS = [
    # The broker's apps (they need no contrib app): channels, producers and messages; consumers;
    # jobs and the dispatcher. With django.contrib.admin installed, they appear in the admin.
    "broker",
    "consumers",
    "jobs",
    # The shop's own.
    "shop",
]

# One database for the shop's tables and the broker's, PostgreSQL: that is what makes the outbox
# atomic.
DATABASES = {
    "default": parse_database_url(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/shop")
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Payloads above BROKER_PAYLOAD_OFFLOAD_BYTES (256 KiB) are kept here rather than in the database;
# the shop and its dispatchers must all reach the same storage (`manage.py check`: broker.E002).
STORAGES = {
    "broker_payloads": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {
            "location": os.environ.get(
                "SHOP_PAYLOAD_DIR", str(Path(__file__).resolve().parent.parent / "payloads")
            )
        },
    },
}
USE_TZ = True
TIME_ZONE = "UTC"

# Consumer tokens and signing secrets are encrypted with these keys; without them, with a key
# derived from SECRET_KEY (so rotating SECRET_KEY would make them unreadable).
BROKER_ENCRYPTION_KEYS = [
    key for key in os.environ.get("SHOP_BROKER_ENCRYPTION_KEYS", "").split(",") if key
]
# For a demo receiver on this machine only: callbacks to private addresses are refused otherwise.
BROKER_ALLOW_PRIVATE_CALLBACKS = os.environ.get("SHOP_ALLOW_PRIVATE_CALLBACKS") == "true"
