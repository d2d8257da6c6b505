"""The queue's SQL in named blocks (the files of jobs/queue/sql/, read by jobs/queue/queries.py):
every statement is named, commented and complete, each file is under the project's 400 lines and
ships in the package, and nothing outside jobs/queue writes queue SQL."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest
from django.apps import apps

from broker.message_states import MessageStatus
from consumers.models import Consumer
from jobs.queue import Guard, queries
from jobs.states import JobStatus

ROOT = Path(__file__).resolve().parents[2]


def test_every_statement_is_complete():
    slots = {"requeue_assignments": "attempts = %(set_attempts)s"}
    for name in queries.names():
        text = queries.statement(name, **slots) if name.startswith("requeue") else None
        text = text or queries.statement(name)
        assert not re.search(r"\{\w+", text), name  # every fragment and constant filled in
        assert text.strip(), name


def sql_sources() -> dict[str, str]:
    return {path.name: path.read_text(encoding="utf-8") for path in queries.sql_files()}


def test_every_block_says_what_it_is_for():
    for source in sql_sources().values():
        for head in re.finditer(r"^-- (name|fragment): .*\n(.*)$", source, re.MULTILINE):
            assert head.group(2).startswith("-- "), head.group(0)


def test_every_file_is_a_part_under_400_lines_that_the_package_ships():
    files = sql_sources()
    assert len(files) > 1
    for name, source in files.items():
        assert source.startswith("--"), name  # a preamble saying what part it holds
        assert len(source.splitlines()) < 400, name
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = shipped["tool"]["setuptools"]["package-data"]["jobs"]
    for path in queries.sql_files():
        inside = path.relative_to(ROOT / "jobs").as_posix()
        assert any(fnmatch.fnmatch(inside, pattern) for pattern in patterns), inside


def test_a_fragment_takes_its_arguments():
    assert "consumer.event_types" in queries.fragment("subscribed", "consumer", "patterns")
    with pytest.raises(TypeError):
        queries.fragment("subscribed", "consumer")


def sql_blocks() -> dict[str, str]:
    """Each statement's and fragment's SQL as written (constants not filled in), comments out."""
    blocks = {}
    for source in sql_sources().values():
        heads = list(re.finditer(r"^-- (?:name|fragment): (\w+).*$", source, re.MULTILINE))
        ends = [head.start() for head in heads[1:]] + [len(source)]
        for head, end in zip(heads, ends, strict=True):
            blocks[head.group(1)] = re.sub(r"--.*$", "", source[head.end() : end], flags=re.M)
    return blocks


# Quoted words of the SQL that are not a model's values: arguments of PostgreSQL's functions, and
# what a try to take the wake-up guard found (sql/wakeup.sql).
NOT_MODEL_VALUES = {"hex", "application_name"} | {found.value for found in Guard}


def test_every_state_and_kind_the_sql_writes_is_a_value_of_its_model():
    """The statements write job and message states and consumer kinds as literals (so that
    partial indexes match even in generic plans): each must be a value of its enum."""
    job_states = {status.value for status in JobStatus}
    message_states = {status.value for status in MessageStatus}
    kinds = {"type": set(Consumer.Type.values), "ordering": set(Consumer.Ordering.values)}
    for name, sql in sql_blocks().items():
        for literal in re.findall(r"'(\w+)'", sql):
            if literal in message_states:
                assert "broker_message" in sql, (name, literal)  # a message's state
            elif literal.isupper():
                assert literal in job_states, (name, literal)
            else:
                assert literal in set().union(*kinds.values()) | NOT_MODEL_VALUES, (name, literal)
        for column, literal in re.findall(r"\b(type|ordering) = '(\w+)'", sql):
            assert literal in kinds[column], (name, column, literal)


def test_every_table_the_sql_names_is_a_models():
    """The statements name the models' tables (jobs_job, consumers_consumer, broker_message...):
    each must be the table of a model, or of a many-to-many relation between models."""
    tables = {model._meta.db_table for model in apps.get_models(include_auto_created=True)}
    for name, sql in sql_blocks().items():
        for table in re.findall(r"\b(?:broker|consumers|jobs)_\w+", sql):
            assert table in tables, (name, table)


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
