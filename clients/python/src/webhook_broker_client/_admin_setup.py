"""Admin calls for the broker's setup: channels, producers, consumers, secrets, event types."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from webhook_broker_client._admin_base import AdminBase, path
from webhook_broker_client.models import Channel, Consumer, EventType, Producer, SigningSecret

# A setting the consumer form takes: None leaves it out (kept on update, the broker's default on
# create); "" (blank) sets it back to the default; a value sets it.
Blank = Literal[""]


class SetupCalls(AdminBase):
    # Seed files
    def load_seed(self, text: str) -> list[str]:
        """Load a webhook-broker seed file (`POST /seed`) in one transaction; the broker's lines:
        one per resource (`channel orders: created`), and one per token it generated (`consumer
        orders/billing: token …`), shown this once. A file with a problem raises BadRequest,
        naming it, and loads nothing. Sent once: a load is not repeated by the retry rule."""
        headers = {"Content-Type": "text/plain; charset=utf-8"}
        answer = self._http.request("POST", "/seed", content=text.encode(), headers=headers)
        loaded: list[str] = answer.json()["Loaded"]
        return loaded

    # Channels
    def channels(self) -> Iterator[str]:
        """Every channel's ID, newest first."""
        return self._ids("/channels")

    def get_channel(self, channel_id: str) -> Channel:
        result: Channel = self._get(path("channel", channel_id))
        return result

    def put_channel(
        self, channel_id: str, *, name: str | None = None, token: str | None = None
    ) -> Channel:
        """Create or update; the answer's `Token` is the only time the token is shown."""
        result: Channel = self._put(path("channel", channel_id), {"name": name, "token": token})
        return result

    # Producers
    def producers(self) -> Iterator[str]:
        return self._ids("/producers")

    def get_producer(self, producer_id: str) -> Producer:
        result: Producer = self._get(path("producer", producer_id))
        return result

    def put_producer(
        self,
        producer_id: str,
        *,
        name: str | None = None,
        token: str | None = None,
        channels: Sequence[str] | None = None,
    ) -> Producer:
        """Create or update; `channels`: those it may publish to (docs/api.md, bound producers)."""
        fields = {"name": name, "token": token, "channels": channels}
        result: Producer = self._put(path("producer", producer_id), fields)
        return result

    # Consumers
    def consumers(self, channel_id: str) -> Iterator[str]:
        return self._ids(path("channel", channel_id, "consumers"))

    def get_consumer(self, channel_id: str, consumer_id: str) -> Consumer:
        result: Consumer = self._get(path("channel", channel_id, "consumer", consumer_id))
        return result

    def put_consumer(
        self,
        channel_id: str,
        consumer_id: str,
        *,
        callback_url: str | None = None,
        name: str | None = None,
        token: str | None = None,
        type: Literal["push", "pull"] | None = None,  # the broker's field name
        ordering: Literal["none", "ordered"] | None = None,
        retry_delays: Sequence[int] | Blank | None = None,
        non_retryable_statuses: Sequence[int] | Blank | None = None,
        max_in_flight: int | Blank | None = None,
        max_job_age: int | Blank | None = None,
        max_per_second: float | Blank | None = None,
        event_types: Sequence[str] | Blank | None = None,
        signing_secret: str | None = None,
    ) -> Consumer:
        """Create or update a push or pull consumer (docs/api.md, "Management writes").

        `callback_url` is required on create (an update without it keeps it). None leaves a
        field out (kept on update); "" sets it back to the broker's default. Every field the
        broker's form takes is here.
        """
        fields = {
            "callbackUrl": callback_url,
            "name": name,
            "token": token,
            "type": type,
            "ordering": ordering,
            "retryDelays": retry_delays,
            "nonRetryableStatuses": non_retryable_statuses,
            "maxInFlight": max_in_flight,
            "maxJobAge": max_job_age,
            "maxPerSecond": max_per_second,
            "eventTypes": event_types,
            "signingSecret": signing_secret,
        }
        url = path("channel", channel_id, "consumer", consumer_id)
        precondition, current = self._current(url)
        if callback_url is None and current is not None:
            # The form needs the URL on update too: the one it has (docs/api.md).
            fields["callbackUrl"] = current["CallbackURL"]
        result: Consumer = self._send_form("PUT", url, fields, precondition).json()
        return result

    def delete_consumer(self, channel_id: str, consumer_id: str) -> None:
        """Delete it with its jobs (queued, in flight and dead); the messages stay."""
        self._delete(path("channel", channel_id, "consumer", consumer_id))

    def pause_consumer(self, channel_id: str, consumer_id: str) -> Consumer:
        return self._consumer_command(channel_id, consumer_id, "pause")

    def resume_consumer(self, channel_id: str, consumer_id: str) -> Consumer:
        return self._consumer_command(channel_id, consumer_id, "resume")

    def close_circuit(self, channel_id: str, consumer_id: str) -> Consumer:
        return self._consumer_command(channel_id, consumer_id, "circuit", "close")

    def _consumer_command(self, channel_id: str, consumer_id: str, *command: str) -> Consumer:
        result: Consumer = self._post(
            path("channel", channel_id, "consumer", consumer_id, *command)
        )
        return result

    # Signing secrets
    def signing_secret(self, channel_id: str, consumer_id: str) -> SigningSecret:
        """The consumer's secret (`whsec_...`) that signs its deliveries (for `verify`)."""
        url = path("channel", channel_id, "consumer", consumer_id, "secret")
        result: SigningSecret = self._get(url)
        return result

    def rotate_signing_secret(self, channel_id: str, consumer_id: str) -> SigningSecret:
        """A new secret; the previous one keeps signing too for 24 hours."""
        url = path("channel", channel_id, "consumer", consumer_id, "secret")
        result: SigningSecret = self._post(url)
        return result

    # Event type catalogue
    def event_types(self, channel_id: str) -> Iterator[str]:
        return self._ids(path("channel", channel_id, "event-types"))

    def get_event_type(self, channel_id: str, name: str) -> EventType:
        result: EventType = self._get(path("channel", channel_id, "event-type", name))
        return result

    def put_event_type(
        self,
        channel_id: str,
        name: str,
        *,
        description: str | None = None,
        schema: Mapping[str, Any] | Blank | None = None,
    ) -> EventType:
        """Create or update; `schema` a JSON Schema the payloads of this type must match."""
        schema_text = json.dumps(schema) if isinstance(schema, Mapping) else schema
        fields = {"description": description, "schema": schema_text}
        result: EventType = self._put(path("channel", channel_id, "event-type", name), fields)
        return result

    def delete_event_type(self, channel_id: str, name: str) -> None:
        self._delete(path("channel", channel_id, "event-type", name))
