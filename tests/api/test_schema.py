"""The OpenAPI schema is generated from the code and served with browsable docs (docs/api.md)."""

from __future__ import annotations

import json
import logging
import re

import pytest

from tests.helpers import make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db

WEBHOOK_BROKER_PATHS = [
    "/producers",
    "/producer/{resource_id}",
    "/channels",
    "/channel/{resource_id}",
    "/channel/{channel_id}/consumers",
    "/channel/{channel_id}/consumer/{consumer_id}",
    "/channel/{channel_id}/broadcast",
    "/channel/{channel_id}/message/{message_id}",
    "/channel/{channel_id}/messages",
    "/channel/{channel_id}/messages-status",
    "/channel/{channel_id}/scheduled-messages",
    "/channel/{channel_id}/scheduled-message/{message_id}",
    "/channel/{channel_id}/consumer/{consumer_id}/queued-jobs",
    "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}",
    "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}/requeue-dead-job",
    "/channel/{channel_id}/consumer/{consumer_id}/dlq",
    "/channel/{channel_id}/consumer/{consumer_id}/claim",
    "/dlq-status",
    "/job-status",
]


def test_schema_is_served_and_describes_every_endpoint(client):
    response = client.get("/api/schema/", headers={"Accept": "application/json"})

    assert response.status_code == 200
    schema = json.loads(response.content)
    assert schema["openapi"].startswith("3.")
    assert set(WEBHOOK_BROKER_PATHS) <= set(schema["paths"])
    assert schema["components"]["securitySchemes"]["adminToken"]["scheme"] == "bearer"


def operation(client, path, method="get"):
    schema = client.get("/api/schema/", headers={"Accept": "application/json"}).json()
    return schema["paths"][path][method]


ADMIN_TOKEN_REQUIREMENT: dict[str, list[str]] = {"adminToken": []}


def test_status_needs_no_credentials_in_the_schema_and_admin_endpoints_still_do(client):
    # No security requirement is what drf-spectacular emits for the public broadcast too.
    assert "security" not in operation(client, "/_status")
    for path in ("/producers", "/metrics"):
        security = operation(client, path)["security"]
        assert ADMIN_TOKEN_REQUIREMENT in security, path
        assert {} not in security, path  # an empty requirement would make the token optional


def test_the_schema_follows_the_settings_that_open_and_close_status_and_metrics(client, settings):
    settings.BROKER_PUBLIC_STATUS = False
    settings.BROKER_PUBLIC_METRICS = True

    assert ADMIN_TOKEN_REQUIREMENT in operation(client, "/_status")["security"]
    assert "security" not in operation(client, "/metrics")
    assert "security" not in operation(client, "/channel/{channel_id}/broadcast", "post")


@pytest.mark.parametrize("url", ["/api/docs/", "/api/redoc/"])
def test_browsable_docs_use_locally_served_assets(client, url):
    page = client.get(url).content.decode()

    assert "/static/drf_spectacular_sidecar/" in page
    # No asset from elsewhere (a CDN): the page's random tokens may spell "cdn" by chance.
    assert not re.search(r"""(?:src|href)\s*[=:]\s*["']?(?:https?:)?//""", page), page
    assert not re.search(r"//[\w.-]*cdn[\w.-]*\.", page, re.IGNORECASE), page


def test_tokens_never_reach_the_logs(client, admin_client, caplog):
    channel = make_channel("orders", token="channel-secret-1")
    make_producer("shop", token="producer-secret-2")
    make_consumer(channel, "billing", type="pull").set_token("consumer-secret-3")
    secrets = ["channel-secret-1", "producer-secret-2", "consumer-secret-3", "wrong-secret-4"]

    with caplog.at_level(logging.DEBUG):
        client.post(
            "/channel/orders/broadcast",
            b"x",
            content_type="text/plain",
            headers={
                "X-Broker-Channel-Token": "channel-secret-1",
                "X-Broker-Producer-ID": "shop",
                "X-Broker-Producer-Token": "wrong-secret-4",
            },
        )
        client.get(
            "/channel/orders/consumer/billing/queued-jobs",
            headers={"X-Broker-Channel-Token": "wrong-secret-4"},
        )
        client.get("/producers", headers={"Authorization": "Bearer wrong-secret-4"})
        admin_client.put("/producer/other", "token=producer-secret-2", content_type="text/plain")

    assert caplog.records  # the refusals were logged...
    for secret in secrets:
        assert secret not in caplog.text  # ...without any secret
