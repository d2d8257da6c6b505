"""`tail CHANNEL`: new messages and their deliveries, live, until Ctrl-C.

It polls the admin API: the channel's newest message IDs (a message not seen before is new),
then each new message's jobs until every one is DELIVERED or DEAD, printing each change of a
job's status. A state that lasts less than a poll (a quick INFLIGHT) may not be seen.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice

import click

from webhook_broker_client.admin import Admin
from webhook_broker_client.cli.app import json_option
from webhook_broker_client.cli.output import emit_line, note
from webhook_broker_client.cli.settings import admin_client
from webhook_broker_client.errors import NotFound
from webhook_broker_client.models import JobSummary, Message

FINAL = frozenset({"DELIVERED", "DEAD"})
# Messages known when tail starts: the newest this many are enough to find where new ones begin.
KNOWN_AT_START = 100
# Messages whose jobs are followed at once; a busier channel has its later messages shown
# without their outcomes, rather than tail falling ever further behind.
MAX_FOLLOWED = 100


@dataclass
class Follower:
    """What tail has seen: the message IDs, and the last status shown of each followed job."""

    admin: Admin
    channel: str
    seen: set[str] = field(default_factory=set)
    followed: dict[str, dict[str, tuple[str, int]]] = field(default_factory=dict)

    def start(self) -> None:
        self.seen.update(islice(self.admin.messages(self.channel), KNOWN_AT_START))

    def poll(self) -> None:
        for message_id in reversed(list(self._new_ids())):
            self.seen.add(message_id)
            self._show_new(message_id)
        for message_id in list(self.followed):
            self._follow(message_id)

    def _new_ids(self) -> Iterator[str]:
        for message_id in self.admin.messages(self.channel):
            if message_id in self.seen:
                return
            yield message_id

    def _show_new(self, message_id: str) -> None:
        try:
            message = self.admin.get_message(self.channel, message_id)
        except NotFound:
            return  # deleted by retention in between
        kind = f" (event type {message['EventType']})" if message.get("EventType") else ""
        emit_line(
            {
                "event": "message",
                "channel": self.channel,
                "messageId": message_id,
                "eventType": message.get("EventType"),
                "receivedAt": message.get("ReceivedAt"),
                "jobs": len(message["Jobs"]),
            },
            f"{_now()} {message_id}: published{kind}, {len(message['Jobs'])} job(s)",
        )
        if len(self.followed) < MAX_FOLLOWED:
            self.followed[message_id] = {}
            self._show_jobs(message)

    def _follow(self, message_id: str) -> None:
        try:
            self._show_jobs(self.admin.get_message(self.channel, message_id))
        except NotFound:
            del self.followed[message_id]

    def _show_jobs(self, message: Message) -> None:
        shown = self.followed[message["ID"]]
        for job in message["Jobs"]:
            state = (job["Status"], job["Attempts"])
            if shown.get(job["ID"]) != state:
                shown[job["ID"]] = state
                _show_job(message["ID"], job)
        if all(job["Status"] in FINAL for job in message["Jobs"]):
            del self.followed[message["ID"]]


def _now() -> str:
    return datetime.now().strftime("%H:%M:%S")


def _show_job(message_id: str, job: JobSummary) -> None:
    error = f": {job['LastError']}" if job.get("LastError") else ""
    emit_line(
        {
            "event": "job",
            "messageId": message_id,
            "consumer": job["ListenerName"],
            "jobId": job["ID"],
            "status": job["Status"],
            "attempts": job["Attempts"],
            "lastError": job.get("LastError") or None,
        },
        f"{_now()} {message_id} -> {job['ListenerName']}: {job['Status']}"
        f" (attempts {job['Attempts']}){error}",
    )


@click.command()
@click.argument("channel")
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True, help="Seconds."
)
@json_option
def tail(channel: str, interval: float) -> None:
    """Follow CHANNEL's new messages and their delivery outcomes until Ctrl-C.

    With --json, one JSON object per line: {"event": "message", ...} or {"event": "job", ...}.
    """
    with admin_client() as admin:
        follower = Follower(admin, channel)
        follower.start()  # a wrong channel or token fails here, before anything is shown
        note(f"following {channel} (Ctrl-C to stop)")
        try:
            while True:
                follower.poll()
                time.sleep(interval)
        except KeyboardInterrupt:
            note("stopped")
