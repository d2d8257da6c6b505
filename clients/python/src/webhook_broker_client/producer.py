"""Publishing messages: `Producer` (blocking) and `AsyncProducer` (asyncio).

A publish is retried on no answer, 5xx and 429 (the HTTP layer's RetryPolicy) with the same
message ID, made before the first try when the caller gives none. A retry can therefore never
store a message twice: if an earlier try was stored and only its answer was lost, the broker
answers 409 for the ID it already has, and that counts as success. A 409 to the very first try
counts as success too (the message is there), but it says the ID was taken before this call:
`Published.already_stored`, which the command line reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self
from urllib.parse import quote

import httpx

from webhook_broker_client._http import DEFAULT_TIMEOUT, AsyncHttpClient, HttpClient, RetryPolicy
from webhook_broker_client._messages import (
    BatchMessage,
    Payload,
    batch_request,
    broadcast_request,
    is_our_batch_again,
)
from webhook_broker_client.errors import Conflict

__all__ = ["AsyncProducer", "BatchMessage", "Producer"]


def _credentials(channel_token: str, producer_id: str, producer_token: str) -> dict[str, str]:
    return {
        "X-Broker-Channel-Token": channel_token,
        "X-Broker-Producer-ID": producer_id,
        "X-Broker-Producer-Token": producer_token,
    }


def _message(payload: Payload, **keywords: Any) -> BatchMessage:
    keywords["headers"] = keywords.get("headers") or {}
    return BatchMessage(payload, **keywords)


@dataclass(frozen=True)
class Published:
    """What one broadcast did (internal: `publish` returns only the ID)."""

    message_id: str
    # The broker answered 409 to the first try: the channel had this ID before this call, so
    # this call stored nothing (a 409 after a retry of ours is our own earlier try, stored).
    already_stored: bool = False


def _published(message_id: str, conflict: Conflict | None) -> Published:
    return Published(message_id, conflict is not None and conflict.tries == 1)


def _stored_ids(response: httpx.Response) -> list[str]:
    return [str(item["id"]) for item in response.json()["messages"]]


class Producer:
    """Publishes to one channel as one producer.

    `publish` and `publish_batch` raise a BrokerError subclass (errors.py) for every refusal,
    with the broker's status and message, and BrokerUnavailable once the retries are used up.
    """

    def __init__(
        self,
        base_url: str,
        channel_id: str,
        channel_token: str,
        producer_id: str,
        producer_token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.channel_id = channel_id
        self._path = f"/channel/{quote(channel_id, safe='')}"
        credentials = _credentials(channel_token, producer_id, producer_token)
        self._http = HttpClient(base_url, headers=credentials, timeout=timeout, retry=retry)

    def publish(
        self,
        payload: Payload,
        *,
        message_id: str | None = None,
        content_type: str | None = None,
        event_type: str | None = None,
        ordering_key: str | None = None,
        priority: int | None = None,
        scheduled_for: datetime | str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """Publish one message and return its ID.

        `payload`: bytes as they are, str as UTF-8 (default content type text/plain), a dict or
        list as JSON (default application/json). `headers` are metadata headers the broker keeps
        and sends with every delivery. `scheduled_for` (an aware datetime or RFC 3339 text)
        makes it a scheduled message, released at that time.
        """
        message = _message(
            payload,
            message_id=message_id,
            content_type=content_type,
            event_type=event_type,
            ordering_key=ordering_key,
            priority=priority,
            scheduled_for=scheduled_for,
            headers=headers,
        )
        return self._publish_message(message).message_id

    def _publish_message(self, message: BatchMessage) -> Published:
        message_id, request_headers, body = broadcast_request(message)
        try:
            self._http.request(
                "POST", f"{self._path}/broadcast", content=body, headers=request_headers, retry=True
            )
        except Conflict as conflict:  # the broker has this ID: an earlier try's, or the caller's
            return _published(message_id, conflict)
        return _published(message_id, None)

    def publish_batch(self, messages: Iterable[BatchMessage]) -> list[str]:
        """Publish many messages at once, all or nothing; their IDs, in order."""
        ids, body = batch_request(messages)
        try:
            response = self._http.request(
                "POST", f"{self._path}/broadcast-batch", json=body, retry=True
            )
        except Conflict as conflict:
            if is_our_batch_again(conflict, ids):
                return ids
            raise
        return _stored_ids(response)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncProducer:
    """Producer for asyncio: the same methods, awaited."""

    def __init__(
        self,
        base_url: str,
        channel_id: str,
        channel_token: str,
        producer_id: str,
        producer_token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.channel_id = channel_id
        self._path = f"/channel/{quote(channel_id, safe='')}"
        credentials = _credentials(channel_token, producer_id, producer_token)
        self._http = AsyncHttpClient(base_url, headers=credentials, timeout=timeout, retry=retry)

    async def publish(
        self,
        payload: Payload,
        *,
        message_id: str | None = None,
        content_type: str | None = None,
        event_type: str | None = None,
        ordering_key: str | None = None,
        priority: int | None = None,
        scheduled_for: datetime | str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """As Producer.publish."""
        message = _message(
            payload,
            message_id=message_id,
            content_type=content_type,
            event_type=event_type,
            ordering_key=ordering_key,
            priority=priority,
            scheduled_for=scheduled_for,
            headers=headers,
        )
        return (await self._publish_message(message)).message_id

    async def _publish_message(self, message: BatchMessage) -> Published:
        message_id, request_headers, body = broadcast_request(message)
        try:
            await self._http.request(
                "POST", f"{self._path}/broadcast", content=body, headers=request_headers, retry=True
            )
        except Conflict as conflict:  # the broker has this ID: an earlier try's, or the caller's
            return _published(message_id, conflict)
        return _published(message_id, None)

    async def publish_batch(self, messages: Iterable[BatchMessage]) -> list[str]:
        """As Producer.publish_batch."""
        ids, body = batch_request(messages)
        try:
            response = await self._http.request(
                "POST", f"{self._path}/broadcast-batch", json=body, retry=True
            )
        except Conflict as conflict:
            if is_our_batch_again(conflict, ids):
                return ids
            raise
        return _stored_ids(response)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
