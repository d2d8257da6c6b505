"""Admin calls about messages and jobs: messages, replays, scheduled and periodic messages, DLQs."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from webhook_broker_client._admin_base import AdminBase, path
from webhook_broker_client._messages import rfc3339
from webhook_broker_client.models import (
    DeadJob,
    DlqAction,
    DlqResult,
    Message,
    MessageJob,
    MessagesStatus,
    PeriodicMessage,
    Replay,
    ScheduledMessage,
)


def _dlq_result(answer: Mapping[str, Any], count_field: str) -> DlqResult:
    """The count, and the action when the work goes on in the background (docs/api.md)."""
    return {"count": int(answer[count_field]), "action": answer.get("action")}


def _periodic_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The schedule's keywords in the broker's form names; bytes payloads as base64."""
    wire = {_CAMEL.get(name, name): value for name, value in fields.items()}
    payload = wire.get("payload")
    if isinstance(payload, bytes):
        wire["payload"] = base64.b64encode(payload).decode()
        wire["payloadEncoding"] = "base64"
    if isinstance(wire.get("headers"), Mapping):
        wire["headers"] = json.dumps(dict(wire["headers"]))
    return wire


_CAMEL = {
    "content_type": "contentType",
    "ordering_key": "orderingKey",
    "event_type": "eventType",
    "interval_seconds": "intervalSeconds",
    "time_zone": "timeZone",
    "skip_while_pending": "skipWhilePending",
}


class MessageCalls(AdminBase):
    # Messages
    def get_message(self, channel_id: str, message_id: str) -> Message:
        """A message with its jobs, one per consumer (`Jobs`)."""
        result: Message = self._get(path("channel", channel_id, "message", message_id))
        return result

    def message_jobs(self, channel_id: str, message_id: str) -> list[MessageJob]:
        """A message's jobs: each consumer's status, attempts, last error and last attempt."""
        return self.get_message(channel_id, message_id)["Jobs"]

    def messages(self, channel_id: str, status: str | Sequence[str] | None = None) -> Iterator[str]:
        """Message IDs, newest first; `status` ACKNOWLEDGED, DISPATCHED or SCHEDULED (or a list)."""
        statuses = [status] if isinstance(status, str) else list(status or [])
        params = {"status": statuses} if statuses else None
        return self._ids(path("channel", channel_id, "messages"), params)

    def messages_status(self, channel_id: str) -> MessagesStatus:
        result: MessagesStatus = self._get(path("channel", channel_id, "messages-status"))
        return result

    def replay(self, channel_id: str, message_id: str, consumer_id: str | None = None) -> Replay:
        """Deliver a delivered message again, to one consumer or to every one."""
        url = path("channel", channel_id, "message", message_id, "replay")
        result: Replay = self._post(url, {"consumer": consumer_id} if consumer_id else None)
        return result

    # Scheduled messages
    def scheduled_messages(self, channel_id: str, status: str | None = None) -> Iterator[str]:
        """Scheduled message IDs; `status` SCHEDULED (waiting) or DISPATCHED (released)."""
        url = path("channel", channel_id, "scheduled-messages")
        params = {"status": status} if status else None
        return self._ids(url, params, result_key="result", pages_key="pages")

    def get_scheduled_message(self, channel_id: str, message_id: str) -> ScheduledMessage:
        url = path("channel", channel_id, "scheduled-message", message_id)
        result: ScheduledMessage = self._get(url)
        return result

    def cancel_scheduled_message(self, channel_id: str, message_id: str) -> None:
        """Cancel a message not released yet (409, Conflict, once it is)."""
        self._http.request("DELETE", path("channel", channel_id, "scheduled-message", message_id))

    # Periodic messages
    def periodic_messages(self, channel_id: str) -> Iterator[str]:
        return self._ids(path("channel", channel_id, "periodic-messages"))

    def get_periodic_message(self, channel_id: str, periodic_id: str) -> PeriodicMessage:
        url = path("channel", channel_id, "periodic-message", periodic_id)
        result: PeriodicMessage = self._get(url)
        return result

    def put_periodic_message(
        self,
        channel_id: str,
        periodic_id: str,
        *,
        producer: str | None = None,
        payload: bytes | str | None = None,
        content_type: str | None = None,
        priority: int | None = None,
        headers: Mapping[str, str] | None = None,
        ordering_key: str | None = None,
        event_type: str | None = None,
        interval_seconds: int | None = None,
        cron: str | None = None,
        time_zone: str | None = None,
        enabled: bool | None = None,
        skip_while_pending: bool | None = None,
    ) -> PeriodicMessage:
        """Create or update a schedule (docs/periodic.md); on create `producer`, `payload` and
        one of `interval_seconds` and `cron` are required. None leaves a field as it is."""
        fields = _periodic_fields(
            {
                "producer": producer,
                "payload": payload,
                "content_type": content_type,
                "priority": priority,
                "headers": headers,
                "ordering_key": ordering_key,
                "event_type": event_type,
                "interval_seconds": interval_seconds,
                "cron": cron,
                "time_zone": time_zone,
                "enabled": enabled,
                "skip_while_pending": skip_while_pending,
            }
        )
        url = path("channel", channel_id, "periodic-message", periodic_id)
        result: PeriodicMessage = self._put(url, fields)
        return result

    def delete_periodic_message(self, channel_id: str, periodic_id: str) -> None:
        """Delete a schedule; the messages it published stay."""
        self._delete(path("channel", channel_id, "periodic-message", periodic_id))

    # Dead-letter queues
    def dead_jobs(self, channel_id: str, consumer_id: str) -> Iterator[DeadJob]:
        """A consumer's dead jobs, most recently dead first."""
        url = path("channel", channel_id, "consumer", consumer_id, "dlq")
        return self._list(url, result_key="DeadJobs")

    def requeue_dlq(
        self, channel_id: str, consumer_id: str, *, since: datetime | str | None = None
    ) -> DlqResult:
        """Requeue the dead jobs (those dead since `since` only, when given)."""
        url = path("channel", channel_id, "consumer", consumer_id, "dlq")
        fields = {"since": rfc3339(since) if since is not None else None}
        return _dlq_result(self._post(url, fields), "requeuedCount")

    def purge_dlq(
        self,
        channel_id: str,
        consumer_id: str,
        *,
        channel_token: str | None = None,
        consumer_token: str | None = None,
    ) -> DlqResult:
        """Delete the dead jobs, as the admin; or with the channel's and the consumer's tokens
        when both are given (webhook-broker's way: docs/api.md, "Dead-letter queue")."""
        url = path("channel", channel_id, "consumer", consumer_id, "dlq")
        tokens = {}
        if channel_token is not None or consumer_token is not None:
            tokens = {
                "X-Broker-Channel-Token": channel_token or "",
                "X-Broker-Consumer-Token": consumer_token or "",
            }
        answer = self._http.request("DELETE", url, headers=tokens).json()
        return _dlq_result(answer, "deletedCount")

    def dlq_action(self, channel_id: str, consumer_id: str, action_id: str) -> DlqAction:
        """How far a requeue or purge that went on in the background got."""
        url = path("channel", channel_id, "consumer", consumer_id, "dlq", "action", action_id)
        result: DlqAction = self._get(url)
        return result
