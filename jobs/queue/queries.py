"""The queue's SQL, by name: every statement the queue runs is written in the files of
jobs/queue/sql/, one per part of the queue (shared.sql: the fragments several parts use;
publish.sql, push_claim.sql, outcomes.sql, circuit.sql, pull.sql, dispatchers.sql, dead_jobs.sql,
leases.sql), and the modules of jobs/queue run them only by name from here (as procrastinate keeps
its queries in named blocks behind its manager). A name is defined once across the files.

Each file is a sequence of blocks, each opened by a comment line (the comments before a file's
first block are its preamble):
- `-- name: claim_for_push` opens a statement;
- `-- fragment: subscribed(consumer, matching)` opens a piece that statements share (a rule of
  jobs/queue/rules.py, a list of columns), with parameters or without.
The comment lines after that say why the SQL is shaped as it is; they are left out of the text
sent, as are those after the SQL. In a block, `{fragment}` or `{fragment(argument, ...)}` is
replaced by that fragment, its `{parameter}`s by the arguments given (SQL expressions, or a
fragment in braces), and `{constant}` by one of the code's constants (`constants()`), so that a
constant has one owner. The few statements completed at run time (a dead-letter batch's columns)
leave a `{slot}` that the caller fills (`statement(name, slot=...)`). Everything else is a
parameter of the statement: values never enter the text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path

from broker.models import Message
from jobs.models import CLOCK_ALLOWANCE, Job
from jobs.states import PENDING_SQL

SQL_DIRECTORY = Path(__file__).with_name("sql")
_BLOCK = re.compile(r"^-- (name|fragment): (\w+)(?:\(([^)]*)\))?\s*$", re.MULTILINE)
# `{name}` or `{name(arguments)}`; an argument may hold one level of braces (a fragment).
_USE = re.compile(r"\{(\w+)(?:\(((?:[^{}()]|\([^{}()]*\)|\{\w+\})*)\))?\}")

# What a pull claim hands a worker (jobs/api/serializers.py, QueuedJobSerializer), as Job and
# Message field names in their models' order of fields, as `Model.from_db` takes them
# (leases.claimed_job).
CLAIMED_JOB_FIELDS = tuple(
    field.attname
    for field in Job._meta.concrete_fields
    if field.attname
    in {"id", "created_at", "consumer_id", "message_id", "status", "priority", "attempts",
        "incremental_timeout"}
)  # fmt: skip
CLAIMED_MESSAGE_FIELDS = tuple(
    field.attname
    for field in Message._meta.concrete_fields
    if field.attname
    in {"id", "public_id", "payload", "payload_file", "content_type", "headers", "event_type"}
)


@functools.cache
def constants() -> Mapping[str, str]:
    """The code's constants that statements name, each written once in Python."""
    # Imported here: rules.py offers its SQL rules through `fragment`, and so imports this module.
    from jobs.queue import rules

    return {
        "default_max_in_flight": str(rules.DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER),
        "slot_horizon_seconds": str(rules.SLOT_HORIZON_SECONDS),
        "wakeup_channel": rules.WAKEUP_CHANNEL,
        "wakeup_guard": str(rules.WAKEUP_GUARD_LOCK),
        "session_prefix": rules.SESSION_PREFIX,
        # The states of a job still on its way, as an SQL list of literals: `status IN {pending}`.
        "pending": PENDING_SQL,
        "clock_allowance_seconds": f"{CLOCK_ALLOWANCE.total_seconds():.0f}",
        "claimed_job_columns": ", ".join(f"j.{name}" for name in CLAIMED_JOB_FIELDS),
        "claimed_message_columns": ", ".join(f"m.{name}" for name in CLAIMED_MESSAGE_FIELDS),
    }


class _Block:
    def __init__(self, parameters: str | None, text: str) -> None:
        self.parameters = [p.strip() for p in parameters.split(",")] if parameters else []
        self.text = text


def sql_files() -> list[Path]:
    """The files of the queue's SQL, in name order."""
    return sorted(SQL_DIRECTORY.glob("*.sql"))


@functools.cache
def _blocks() -> tuple[dict[str, _Block], dict[str, _Block]]:
    """The statements and fragments of every file, by name; read once per process."""
    statements: dict[str, _Block] = {}
    fragments: dict[str, _Block] = {}
    for path in sql_files():
        source = path.read_text(encoding="utf-8")
        heads = list(_BLOCK.finditer(source))
        for head, following in zip(heads, [*heads[1:], None], strict=True):
            kind, name, parameters = head.groups()
            end = following.start() if following else len(source)
            blocks = statements if kind == "name" else fragments
            if name in statements or name in fragments:
                raise ValueError(f"{path.name}: {name} is defined twice")
            blocks[name] = _Block(parameters, _sql_of(source[head.end() : end]))
    return statements, fragments


def _sql_of(block: str) -> str:
    """A block's SQL: without the comment lines before and after it, which are for the reader
    of the file (PostgreSQL need not parse them at every call)."""
    lines = block.strip().splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
        lines.pop(0)
    while lines and (not lines[-1].strip() or lines[-1].lstrip().startswith("--")):
        lines.pop()
    return "\n".join(lines) + "\n"


def _expand(text: str, bound: Mapping[str, str], slots: Mapping[str, str]) -> str:
    def use(match: re.Match[str]) -> str:
        name, arguments = match.group(1), match.group(2)
        if arguments is None and name in bound:
            return bound[name]
        if arguments is None and name in constants():
            return constants()[name]
        if arguments is None and name in slots:
            return slots[name]
        given = [_expand(argument, bound, slots) for argument in _split(arguments)]
        return fragment(name, *given, slots=slots)

    return _USE.sub(use, text)


def _split(arguments: str | None) -> list[str]:
    """The arguments of a use, split at its own commas: `{f()}` gives one empty argument."""
    if arguments is None:
        return []
    parts, depth, current = [], 0, ""
    for char in arguments:
        depth += char in "({"
        depth -= char in ")}"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()]


def fragment(name: str, *arguments: str, slots: Mapping[str, str] | None = None) -> str:
    """The fragment `name`, its parameters bound to `arguments` (SQL text)."""
    block = _blocks()[1][name]
    if len(arguments) != len(block.parameters):
        raise TypeError(f"fragment {name} takes {block.parameters}, given {arguments}")
    # A fragment's own text ends in a newline; where it is used, it is part of a line.
    text = block.text.rstrip("\n")
    return _expand(text, dict(zip(block.parameters, arguments, strict=True)), slots or {})


@functools.cache
def _complete(name: str) -> str:
    return _expand(_blocks()[0][name].text, {}, {})


def statement(name: str, **slots: str) -> str:
    """The statement `name`, ready to run (its `{slot}`s filled by `slots`)."""
    if slots:
        return _expand(_blocks()[0][name].text, {}, slots)
    return _complete(name)


def names() -> list[str]:
    """Every statement's name, in the files' order."""
    return list(_blocks()[0])
