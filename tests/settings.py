"""Test settings: the broker's own, against PostgreSQL unless DATABASE_URL says otherwise.

The README's test command therefore needs no environment: it uses the local PostgreSQL that the
machine (and .ci/run) provide. `DATABASE_URL=sqlite:///test.sqlite3 pytest` runs on SQLite.
"""

from __future__ import annotations

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/broker")
os.environ.setdefault("BROKER_ALLOW_PRIVATE_CALLBACKS", "true")  # receivers run on loopback

from broker.settings import *  # noqa: F403
from broker.settings import DATABASES

# One test database per test process, so concurrent runs (a developer's and CI's, or parallel
# workers) never drop each other's database.
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"]["TEST"] = {"NAME": f"test_broker_{os.getpid()}"}

# Fast hashing for test users; production keeps Django's default.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
