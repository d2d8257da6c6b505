"""Test settings: the broker's own, on the server of DATABASE_URL, or without it on an embedded
PostgreSQL server of the test process's own (tests/embedded_database.py).

The README's test command therefore needs no environment and no PostgreSQL installed.
`DATABASE_URL=postgres://postgres@127.0.0.1:5432/broker pytest` runs on the machine's server
(as .ci/run does once).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

if not os.environ.get("DATABASE_URL"):
    from tests.embedded_database import start_session_server

    # In the environment: the broker processes that tests start use it too.
    os.environ["DATABASE_URL"] = start_session_server()
os.environ.setdefault("BROKER_ALLOW_PRIVATE_CALLBACKS", "true")  # receivers run on loopback
# pytest-xdist's workers inherit the controlling process's environment: its DATABASE_URL (one
# server for the session; a database per process below, and so one per worker, as each worker is
# a process of its own) and its payload directory, which each worker replaces with one of its
# own, as tests count the files in it.
if "BROKER_PAYLOAD_DIR" not in os.environ or "PYTEST_XDIST_WORKER" in os.environ:
    # Offloaded payloads of a test run never land in the project's payloads/; subprocesses that
    # the tests start inherit the variable, and so share the directory.
    os.environ["BROKER_PAYLOAD_DIR"] = tempfile.mkdtemp(prefix="broker-test-payloads-")
    atexit.register(shutil.rmtree, os.environ["BROKER_PAYLOAD_DIR"], ignore_errors=True)

from broker.settings import *  # noqa: F403
from broker.settings import DATABASES

# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set (some CI images set it): without
# it each worker rewrites every test module's asserts again (7 s of CPU each) and every broker
# process a test starts compiles the project again. The files go in __pycache__/, ignored by git.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # for the processes the tests start

# One test database per test process, so concurrent runs (a developer's and CI's, or parallel
# workers) never drop each other's database.
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"]["TEST"] = {"NAME": f"test_broker_{os.getpid()}"}

# Fast hashing for test users; production keeps Django's default.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
