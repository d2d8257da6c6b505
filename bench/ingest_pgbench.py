"""PostgreSQL alone doing what one broadcast asks of it, for bench/ingest.py (issue 18): pgbench
replays the statements a real broadcast sends, so "the broker reaches N % of PostgreSQL alone" is
measured in the same run rather than guessed.

The statements are not copied from the code: `capture()` runs one real broadcast through the
broker's own request path (Django's test client, every middleware and the view) and records what
reaches the database with `connection.execute_wrapper`, SQL and parameters as sent. So when the
publish statement changes (the token check folded into it, a column more) the pgbench script
follows. Each parameter becomes a pgbench variable bound as a prepared statement's parameter
(`-M prepared`), cast to the type PostgreSQL gives it for the statement as the broker sends it;
the message ID, which must be unique per channel, becomes `pg-<client>-<n>` with `n` counted per
pgbench client.

    .venv/bin/python bench/ingest_pgbench.py --capture OUT.json   # inside the broker's env
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
PROBE_ID = "pgbench-probe-message"
PREFIX = "pg-"  # the message IDs pgbench inserts
PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%")
VARIABLE = re.compile(r"(?<!:):[A-Za-z0-9_]")  # what pgbench would take for a variable


@dataclass
class Statement:
    sql: str  # with pgbench variables :p0, :p1 … and :mid
    variables: dict[str, str]  # -D name=value, the parameters' text forms


@dataclass
class PgbenchResult:
    tps: float = 0.0
    transactions: int = 0
    failed: int = 0
    seconds: float = 0.0
    database_cpu: float = 0.0  # PostgreSQL, seconds
    client_cpu: float = 0.0  # pgbench itself, seconds
    stored: tuple[int, int] = (0, 0)  # messages, jobs found afterwards
    statements: int = 0


# --- capture: runs inside the broker's environment (a subprocess of its own) ------------------


def capture(out: Path, channel: str, headers: dict[str, str], payload: str) -> None:
    """One real broadcast through Django; write every statement it sent, ready for pgbench."""
    import django

    sys.path.insert(0, str(ROOT))
    django.setup()
    from django.db import connection
    from django.test import Client

    statements: list[Statement] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        # Converted here, while the request holds its connection (a pool takes it back after).
        raw = context["connection"].connection
        statements.append(to_pgbench(raw, sql, params, f"s{len(statements)}"))
        return execute(sql, params, many, context)

    client = Client(headers={"host": "127.0.0.1"})
    with connection.execute_wrapper(record):
        response = client.post(
            f"/channel/{channel}/broadcast",
            data=payload,
            content_type="application/json",
            headers={**headers, "X-Broker-Message-ID": PROBE_ID},
        )
    if response.status_code != 201:
        raise SystemExit(f"the probe broadcast answered {response.status_code}")
    out.write_text(json.dumps([statement.__dict__ for statement in statements]))


def to_pgbench(raw: psycopg.Connection[Any], sql: str, params: Any, prefix: str) -> Statement:
    """The statement with each placeholder a pgbench variable (`<prefix>p<n>`) cast to the
    parameter's type."""
    from psycopg.adapt import PyFormat, Transformer

    names: dict[str, int] = {}  # a named parameter used twice is one parameter
    values: list[Any] = []
    positional = iter(params if isinstance(params, list | tuple) else ())

    def number(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        name = match.group(1)
        if name is None:
            values.append(next(positional))
            return f"${len(values)}"
        if name not in names:
            values.append(params[name])
            names[name] = len(values)
        return f"${names[name]}"

    numbered = PLACEHOLDER.sub(number, sql)
    if VARIABLE.search(numbered):
        # A ":name" in the statement's own text would be taken for a variable by pgbench.
        raise SystemExit(f"cannot replay with pgbench: {sql[:200]!r}")
    types = parameter_types(raw, numbered, values)
    texts = Transformer(raw).dump_sequence(values, [PyFormat.TEXT] * len(values))
    variables: dict[str, str] = {}
    pieces: list[str] = []
    for n, (value, text, type_name) in enumerate(zip(values, texts, types, strict=True)):
        if value == PROBE_ID:
            pieces.append(f"(('{PREFIX}' || :client_id || '-' || :n)::{type_name})")
        elif text is None:
            pieces.append(f"(NULL::{type_name})")
        elif not text:  # pgbench refuses an empty -D value
            pieces.append(f"(''::{type_name})")
        else:
            variables[f"{prefix}p{n}"] = bytes(text).decode()
            pieces.append(f"(:{prefix}p{n}::{type_name})")
    script_sql = re.sub(r"\$(\d+)\b", lambda m: pieces[int(m.group(1)) - 1], numbered)
    return Statement(script_sql.strip(), variables)


def parameter_types(raw: psycopg.Connection[Any], numbered: str, values: list[Any]) -> list[str]:
    """The parameters' types as PostgreSQL resolves them when psycopg sends these values: the
    statement prepared (not run) with psycopg's own type choices, then described."""
    from psycopg.adapt import PyFormat, Transformer

    transformer = Transformer(raw)
    transformer.dump_sequence(values, [PyFormat.AUTO] * len(values))
    raw.pgconn.prepare(b"ingest_probe", numbered.encode(), list(transformer.types or ()))
    try:
        described = raw.pgconn.describe_prepared(b"ingest_probe")
        oids = [described.param_type(i) for i in range(described.nparams)]
    finally:
        raw.pgconn.exec_(b"DEALLOCATE ingest_probe")
    with raw.cursor() as cursor:
        return [
            str(cursor.execute("SELECT format_type(%s, NULL)", [oid]).fetchone()[0])  # type: ignore[index]
            for oid in oids
        ]


# --- the run: called by bench/ingest.py --------------------------------------------------------


def pgbench_binary() -> str:
    """The server's own major version's pgbench (15 here), else the one on PATH."""
    installed = Path("/usr/lib/postgresql/15/bin/pgbench")
    return str(installed) if installed.exists() else shutil.which("pgbench") or "pgbench"


def captured_statements(
    env: dict[str, str], channel: str, headers: dict[str, str], payload: str
) -> list[Statement]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "statements.json"
        code = (
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r});"
            f" import ingest_pgbench; ingest_pgbench.capture("
            f"__import__('pathlib').Path({str(out)!r}), {channel!r}, {headers!r}, {payload!r})"
        )
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=120)  # noqa: S603
        return [Statement(**item) for item in json.loads(out.read_text())]


def script_text(statements: list[Statement]) -> str:
    # `n` counts this client's transactions (pgbench keeps a client's variables between them;
    # -D n=0 starts it), so (client_id, n) names each message once.
    return "\\set n :n + 1\n" + "".join(f"{statement.sql};\n" for statement in statements)


def run_pgbench(
    database_url: str,
    statements: list[Statement],
    clients: int,
    seconds: float,
    processes: Callable[[], dict[int, float]],
) -> PgbenchResult:
    """pgbench with the broadcast's statements, `clients` connections on 2 threads for
    `seconds`; the CPU of pgbench and of the PostgreSQL processes `processes()` names (CPU
    seconds by pid); the rows checked and deleted afterwards."""
    variables = {"n": "0"}
    for statement in statements:
        variables.update(statement.variables)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(script_text(statements))
    conninfo = psycopg.conninfo.conninfo_to_dict(database_url)
    command = [
        pgbench_binary(), "-n", "-M", "prepared",
        "-c", str(clients), "-j", "2", "-T", str(round(seconds)),
        "-h", str(conninfo["host"]), "-p", str(conninfo.get("port", 5432)),
        "-U", str(conninfo["user"]), "-f", script.name,
        *(f"-D{name}={value}" for name, value in variables.items()),
        str(conninfo["dbname"]),
    ]  # fmt: skip
    result = PgbenchResult(statements=len(statements))
    try:
        children, before = os.times(), processes()
        started = time.perf_counter()
        bench = subprocess.Popen(  # noqa: S603
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        with bench:
            last = watch(bench, processes)
            stdout, stderr = bench.communicate(timeout=seconds + 120)
        result.seconds = time.perf_counter() - started
        after = os.times()
        last.update(processes())
        result.database_cpu = sum(cpu - before.get(pid, 0.0) for pid, cpu in last.items())
        result.client_cpu = (after.children_user + after.children_system) - (
            children.children_user + children.children_system
        )
    finally:
        os.unlink(script.name)
    if bench.returncode != 0:
        raise SystemExit(f"pgbench failed ({bench.returncode}):\n{stdout}\n{stderr}")
    result.tps = float(re.search(r"tps = ([\d.]+) \(without", stdout)[1])  # type: ignore[index]
    result.transactions = int(
        re.search(r"number of transactions actually processed: (\d+)", stdout)[1]  # type: ignore[index]
    )
    failed = re.search(r"number of failed transactions: (\d+)", stdout)
    result.failed = int(failed[1]) if failed else 0
    result.stored = stored_and_deleted(database_url)
    return result


def watch(
    bench: subprocess.Popen[str], processes: Callable[[], dict[int, float]]
) -> dict[int, float]:
    """The last CPU figure seen of each process while pgbench runs, read every 0.2 s: its
    backends end with it, and their CPU with them, so at most the last 0.2 s of it is missed."""
    last: dict[int, float] = {}
    while bench.poll() is None:
        last.update(processes())
        time.sleep(0.2)
    return last


def stored_and_deleted(database_url: str) -> tuple[int, int]:
    """pgbench's messages and their jobs, counted, then deleted."""
    like = f"{PREFIX}%"
    with psycopg.connect(database_url, autocommit=True) as conn:
        messages = conn.execute(
            "SELECT count(*) FROM broker_message WHERE public_id LIKE %s", [like]
        ).fetchone()
        jobs = conn.execute(
            "SELECT count(*) FROM jobs_job j JOIN broker_message m ON m.id = j.message_id"
            " WHERE m.public_id LIKE %s",
            [like],
        ).fetchone()
        conn.execute(
            "DELETE FROM jobs_job WHERE message_id IN"
            " (SELECT id FROM broker_message WHERE public_id LIKE %s)",
            [like],
        )
        conn.execute("DELETE FROM broker_message WHERE public_id LIKE %s", [like])
    return int(messages[0]), int(jobs[0])  # type: ignore[index]
