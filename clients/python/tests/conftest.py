"""One live broker for the whole test session (clients/live_broker.py).

When WEBHOOK_BROKER_URL and WEBHOOK_BROKER_TOKEN are set (`python clients/live_broker.py --
pytest`, or a broker of your own), the tests use that broker instead of starting one.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from webhook_broker_client._http import HttpClient, RetryPolicy
from webhook_broker_client.producer import Producer

CLIENTS_DIR = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Broker:
    url: str
    admin_token: str


def _load_launcher() -> ModuleType:
    """clients/live_broker.py, a script beside the package rather than part of it."""
    spec = importlib.util.spec_from_file_location("live_broker", CLIENTS_DIR / "live_broker.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["live_broker"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    url, token = os.environ.get("WEBHOOK_BROKER_URL"), os.environ.get("WEBHOOK_BROKER_TOKEN")
    if url and token:
        yield Broker(url.rstrip("/"), token)
        return
    with _load_launcher().live_broker(CLIENTS_DIR.parent) as live:
        yield Broker(live.url, live.admin_token)


def unique(prefix: str) -> str:
    """An ID no other test uses, so tests can share one broker (and run against a used one)."""
    return f"{prefix}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Publisher:
    """A channel and a producer made for one test, with their tokens."""

    channel_id: str
    channel_token: str
    producer_id: str
    producer_token: str

    def producer(self, url: str, retry: RetryPolicy | None = None) -> Producer:
        """A Producer with these credentials, sending to `url`: the broker, or a proxy before it."""
        credentials = (self.channel_token, self.producer_id, self.producer_token)
        return Producer(url, self.channel_id, *credentials, retry=retry)


def admin_http(broker: Broker) -> HttpClient:
    """The HTTP layer with the admin token, for the tests' own setup and checks."""
    return HttpClient(broker.url, headers={"Authorization": f"Bearer {broker.admin_token}"})


@pytest.fixture
def publisher(broker: Broker) -> Publisher:
    channel_id, producer_id = unique("ch"), unique("pr")
    with admin_http(broker) as http:
        channel = http.request("PUT", f"/channel/{channel_id}", data={"name": channel_id}).json()
        producer = http.request(
            "PUT", f"/producer/{producer_id}", data={"name": producer_id}
        ).json()
    return Publisher(channel_id, channel["Token"], producer_id, producer["Token"])
