"""`messages get` (a message with every consumer's job), `messages wait` (until a consumer's job
is in a state) and `messages list`."""

from __future__ import annotations

import time

import click
from rich.console import Console

from webhook_broker_client.admin import Admin
from webhook_broker_client.cli.app import json_option
from webhook_broker_client.cli.output import emit, error, fields_of, record, table
from webhook_broker_client.cli.resources import first, limit_option
from webhook_broker_client.cli.settings import admin_client
from webhook_broker_client.errors import NotFound
from webhook_broker_client.models import Message, MessageJob

MESSAGE_FIELDS = [
    "ID",
    "Status",
    "EventType",
    "ContentType",
    "Priority",
    "ProducerID",
    "ReceivedAt",
    "DispatchedAt",
    "Payload",
]
PAYLOAD_SHOWN = 500  # characters of a payload in the table; --json has it whole


def clipped(value: object) -> object:
    text = str(value) if value is not None else None
    if text is None or len(text) <= PAYLOAD_SHOWN:
        return value
    return f"{text[:PAYLOAD_SHOWN]}… ({len(text)} characters; --json shows it whole)"


JOB_COLUMNS = ["ListenerName", "ID", "Status", "Attempts", "StatusChangedAt", "LastError"]


def last_attempt(job: MessageJob) -> str:
    """`#2 at 2026-…Z: HTTP 503 in 25 ms`, or `#1 at …: timeout in 30000 ms`; empty before one."""
    attempt = job.get("LastAttempt")
    if not attempt:
        return ""
    answer = f"HTTP {attempt['StatusCode']}" if attempt["StatusCode"] else attempt["ErrorClass"]
    took = f"{attempt['DurationMs']:.0f} ms"
    return f"#{attempt['Number']} at {attempt['StartedAt']}: {answer} in {took}"


@click.group()
def messages() -> None:
    """A channel's messages and their delivery."""


@messages.command("get")
@click.argument("channel")
@click.argument("message_id", metavar="ID")
@json_option
def get_message(channel: str, message_id: str) -> None:
    """Show a message and each consumer's job: status, attempts, last error."""
    with admin_client() as admin:
        message = admin.get_message(channel, message_id)

    show_message(message)


def show_message(message: Message) -> None:
    def human(out: Console) -> None:
        fields = [
            (name, clipped(value) if name == "Payload" else value)
            for name, value in fields_of(dict(message), MESSAGE_FIELDS)
            if name != "Jobs"
        ]
        out.print(record(f"message {message['ID']}", fields))
        rows = (
            [*(job.get(name) for name in JOB_COLUMNS), last_attempt(job)] for job in message["Jobs"]
        )
        out.print(table("jobs", ["Consumer", *JOB_COLUMNS[1:], "LastAttempt"], rows))

    emit(message, human)


POLL_SECONDS = 0.5
JOB_STATES = ["QUEUED", "INFLIGHT", "DELIVERED", "DEAD"]
EXIT_TIMED_OUT = 1


@messages.command("wait")
@click.argument("channel")
@click.argument("message_id", metavar="ID")
@click.option("--consumer", required=True, help="The consumer's name (its ID unless renamed).")
@click.option("--status", required=True, type=click.Choice(JOB_STATES, case_sensitive=False))
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(min=0))
@json_option
def wait_for_job(channel: str, message_id: str, consumer: str, status: str, timeout: float) -> None:
    """Wait until CONSUMER's job for message ID is in STATUS, then show the message. After
    --timeout seconds, show it with its jobs (Status, LastError say why) and exit 1."""
    deadline = time.monotonic() + timeout
    with admin_client() as admin:
        while True:
            message = _message_or_none(admin, channel, message_id)
            jobs = message["Jobs"] if message else []
            if message and any(
                job["ListenerName"] == consumer and job["Status"] == status.upper() for job in jobs
            ):
                show_message(message)
                return
            if time.monotonic() >= deadline:
                waited = f"{consumer}'s job for {message_id} is not {status.upper()}"
                error(f"gave up after {timeout:g} s: {waited}")
                if message:
                    show_message(message)
                raise click.exceptions.Exit(EXIT_TIMED_OUT)
            time.sleep(POLL_SECONDS)


def _message_or_none(admin: Admin, channel: str, message_id: str) -> Message | None:
    try:
        return admin.get_message(channel, message_id)
    except NotFound:  # not yet: a scheduled message, or one still being published
        return None


@messages.command("list")
@click.argument("channel")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(["ACKNOWLEDGED", "DISPATCHED", "SCHEDULED"], case_sensitive=False),
)
@limit_option
@json_option
def list_messages(channel: str, statuses: tuple[str, ...], limit: int) -> None:
    """List CHANNEL's message IDs, newest first."""
    with admin_client() as admin:
        ids = first(admin.messages(channel, [s.upper() for s in statuses]), limit)

    def human(out: Console) -> None:
        out.print(table(None, ["ID"], ([message_id] for message_id in ids)))

    emit(ids, human)
