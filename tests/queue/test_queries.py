"""The queue's SQL in one file (jobs/queue/queries.sql, read by jobs/queue/queries.py): every
statement is named, commented and complete, and nothing outside jobs/queue writes queue SQL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jobs.queue import queries

ROOT = Path(__file__).resolve().parents[2]


def test_every_statement_is_complete():
    slots = {"requeue_assignments": "attempts = %(set_attempts)s"}
    for name in queries.names():
        text = queries.statement(name, **slots) if name.startswith("requeue") else None
        text = text or queries.statement(name)
        assert not re.search(r"\{\w+", text), name  # every fragment and constant filled in
        assert text.strip(), name


def test_every_block_says_what_it_is_for():
    source = queries.QUERIES_FILE.read_text(encoding="utf-8")
    for head in re.finditer(r"^-- (name|fragment): .*\n(.*)$", source, re.MULTILINE):
        assert head.group(2).startswith("-- "), head.group(0)


def test_a_fragment_takes_its_arguments():
    assert "consumer.event_types" in queries.fragment("subscribed", "consumer", "patterns")
    with pytest.raises(TypeError):
        queries.fragment("subscribed", "consumer")


def test_no_module_outside_the_queue_writes_queue_sql():
    """Statements that change jobs, attempts or consumers' delivery state are the queue's."""
    writes = re.compile(r"\b(UPDATE|INSERT INTO|DELETE FROM)\s+(jobs_job|jobs_deliveryattempt)\b")
    offenders = []
    for path in ROOT.glob("*/**/*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if (
            relative.startswith(("jobs/queue/", "tests/", "bench/", ".venv/"))
            or "/migrations/" in relative
        ):
            continue
        if writes.search(path.read_text(encoding="utf-8")):
            offenders.append(relative)
    assert offenders == []


def test_no_product_module_asks_for_the_database_vendor():
    """PostgreSQL is the store: only the startup check (broker/checks.py), the connection pool's
    setup (broker/apps.py) and the health endpoint's report (broker/views.py) name the vendor."""
    allowed = {"broker/checks.py", "broker/apps.py", "broker/views.py"}
    asking = []
    for path in ROOT.glob("*/**/*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(("tests/", "bench/", ".venv/")) or relative in allowed:
            continue
        if ".vendor" in path.read_text(encoding="utf-8"):
            asking.append(relative)
    assert asking == []
