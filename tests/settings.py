"""Test settings: the broker's own, against PostgreSQL unless DATABASE_URL says otherwise.

The README's test command therefore needs no environment: it uses the local PostgreSQL that the
machine (and .ci/run) provide.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/broker")
os.environ.setdefault("BROKER_ALLOW_PRIVATE_CALLBACKS", "true")  # receivers run on loopback
if "BROKER_PAYLOAD_DIR" not in os.environ:
    # Offloaded payloads of a test run never land in the project's payloads/; subprocesses that
    # the tests start inherit the variable, and so share the directory.
    os.environ["BROKER_PAYLOAD_DIR"] = tempfile.mkdtemp(prefix="broker-test-payloads-")
    atexit.register(shutil.rmtree, os.environ["BROKER_PAYLOAD_DIR"], ignore_errors=True)

from broker.settings import *  # noqa: F403
from broker.settings import DATABASES

# One test database per test process, so concurrent runs (a developer's and CI's, or parallel
# workers) never drop each other's database.
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"]["TEST"] = {"NAME": f"test_broker_{os.getpid()}"}

# Fast hashing for test users; production keeps Django's default.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
