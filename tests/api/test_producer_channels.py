"""Producers bound to channels (docs/api.md, "Producers bound to channels"): the channels of
`PUT /producer/{p}`, and what BROKER_PRODUCER_CHANNELS=bound does to every HTTP publish. The
threat: every pull consumer of a channel holds its token, so with webhook-broker's open rule
any producer that is also such a consumer can publish into that channel."""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.utils import timezone
from django.utils.http import http_date

from broker.models import Message, Producer
from tests.api_server import running_api
from tests.conftest import FORM
from tests.db_snapshot import snapshot
from tests.helpers import PULL_HEADERS, make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db

# "shop" publishes to "orders"; it also runs "audit-reader", a pull consumer of "audit", so it
# holds the audit channel's token too.
AUDIT_AS_SHOP = {
    "X-Broker-Channel-Token": "audit-token",
    "X-Broker-Producer-ID": "shop",
    "X-Broker-Producer-Token": "shop-token",
}
ORDERS_AS_SHOP = {**AUDIT_AS_SHOP, "X-Broker-Channel-Token": "orders-token"}
REFUSAL = (
    "Producer 'shop' may not publish to channel 'audit': with BROKER_PRODUCER_CHANNELS=bound a "
    "producer publishes only to the channels it is allowed on (an admin adds them with the "
    "field channels of PUT /producer/shop)."
)


@pytest.fixture(autouse=True)
def stakeholders():
    orders = make_channel("orders", token="orders-token")
    audit = make_channel("audit", token="audit-token")
    make_channel("billing", token="billing-token")
    shop = make_producer("shop", token="shop-token")
    shop.allowed_channels.set([orders])
    make_consumer(orders, "warehouse")
    reader = make_consumer(audit, "audit-reader", type="pull")
    reader.set_token("consumer-token")
    reader.save()


@pytest.fixture
def bound(settings):
    settings.BROKER_PRODUCER_CHANNELS = "bound"


def broadcast(client, channel: str, headers: dict[str, str], body: bytes = b'{"n": 1}'):
    return client.post(
        f"/channel/{channel}/broadcast", body, content_type="application/json", headers=headers
    )


def broadcast_batch(client, channel: str, headers: dict[str, str]):
    body = json.dumps({"messages": [{"id": "b-1", "payload": "one"}, {"payload": "two"}]})
    return client.post(
        f"/channel/{channel}/broadcast-batch",
        body,
        content_type="application/json",
        headers=headers,
    )


def put_producer(client, producer_id: str, changed_at=None, **fields):
    headers = {"If-Unmodified-Since": http_date(changed_at.timestamp())} if changed_at else {}
    return client.put(
        f"/producer/{producer_id}", urlencode(fields), content_type=FORM, headers=headers
    )


# --- the admin API: which channels a producer may publish to -----------------------------------


def test_put_sets_the_channels_and_get_shows_them_sorted(admin_client):
    created = put_producer(admin_client, "crm", channels="orders, audit,orders")

    assert created.status_code == 200
    assert created.json()["Channels"] == ["audit", "orders"]
    read = admin_client.get("/producer/crm").json()
    assert read["Channels"] == ["audit", "orders"]
    assert set(read) == {"ID", "Name", "ChangedAt", "Channels"}  # upstream's fields, untouched


def test_an_update_without_channels_keeps_them_and_a_blank_list_clears_them(admin_client):
    shop = Producer.objects.get(pk="shop")
    renamed = put_producer(admin_client, "shop", shop.changed_at, name="The Shop")
    assert renamed.json()["Channels"] == ["orders"]

    shop.refresh_from_db()
    cleared = put_producer(admin_client, "shop", shop.changed_at, channels="")

    assert cleared.status_code == 200
    assert cleared.json()["Channels"] == []
    assert not shop.allowed_channels.exists()


@pytest.mark.parametrize(
    ("channels", "named"),
    [
        ("orders,nowhere", "No channel 'nowhere'"),
        ("orders,bad id!", "'bad id!' is not a channel ID"),
    ],
)
def test_a_bad_list_is_400_naming_it_and_changes_nothing(admin_client, channels, named):
    shop = Producer.objects.get(pk="shop")

    update = put_producer(admin_client, "shop", shop.changed_at, name="Renamed", channels=channels)
    create = put_producer(admin_client, "crm", channels=channels)

    assert (update.status_code, create.status_code) == (400, 400)
    assert named in update.json()["Error"]
    assert named in create.json()["Error"]
    after = Producer.objects.get(pk="shop")
    assert (after.name, after.changed_at) == ("Shop", shop.changed_at)
    assert [c.pk for c in after.allowed_channels.all()] == ["orders"]
    assert not Producer.objects.filter(pk="crm").exists()


def test_channels_are_in_the_openapi_schema(client):
    schema = client.get("/api/schema/", headers={"Accept": "application/json"}).json()

    form = schema["components"]["schemas"]["ProducerFormRequest"]["properties"]
    assert "channels" in form
    assert "Channels" in schema["components"]["schemas"]["Producer"]["properties"]


def test_the_django_admin_edits_them(superuser_client):
    page = superuser_client.get("/admin/broker/producer/shop/change/")
    assert page.status_code == 200
    shop = Producer.objects.get(pk="shop")

    saved = superuser_client.post(
        "/admin/broker/producer/shop/change/",
        {"name": "Shop", "allowed_channels": ["orders", "billing"]},
    )

    assert saved.status_code == 302
    assert sorted(shop.allowed_channels.values_list("pk", flat=True)) == ["billing", "orders"]


# --- open, the default: webhook-broker's rule --------------------------------------------------


def test_open_by_default_a_producer_publishes_to_any_channel_whose_token_it_has(client):
    single = broadcast(client, "audit", AUDIT_AS_SHOP)
    batch = broadcast_batch(client, "audit", AUDIT_AS_SHOP)

    assert (single.status_code, batch.status_code) == (201, 201)
    assert Message.objects.filter(channel_id="audit").count() == 3


# --- bound ------------------------------------------------------------------------------------


def test_bound_a_consumer_with_its_channel_token_cannot_publish_there(client, bound):
    # The pull consumer's own credentials still work: it reads its queue.
    assert (
        client.get(
            "/channel/audit/consumer/audit-reader/queued-jobs",
            headers={**PULL_HEADERS, "X-Broker-Channel-Token": "audit-token"},
        ).status_code
        == 200
    )
    before = snapshot()

    refused = broadcast(client, "audit", AUDIT_AS_SHOP)

    assert refused.status_code == 403
    assert refused.json() == {"Error": REFUSAL}
    assert snapshot() == before


def test_bound_a_producer_still_publishes_to_its_own_channels(client, bound):
    response = broadcast(client, "orders", ORDERS_AS_SHOP | {"X-Broker-Message-ID": "o-1"})

    assert response.status_code == 201
    assert Message.objects.get().public_id == "o-1"


def test_bound_a_wrong_or_missing_token_is_answered_first(client, bound):
    wrong = broadcast(client, "audit", {**AUDIT_AS_SHOP, "X-Broker-Producer-Token": "guess"})
    missing = broadcast(client, "audit", {**AUDIT_AS_SHOP, "X-Broker-Channel-Token": ""})

    # Only a caller holding both tokens learns which channels the producer may publish to.
    assert wrong.status_code == 403
    assert "may not publish" not in wrong.json()["Error"]
    assert missing.status_code == 401


def test_bound_the_separate_token_check_refuses_before_spending_the_allowance(client, settings):
    settings.BROKER_PRODUCER_CHANNELS = "bound"
    settings.BROKER_BROADCAST_RATE_LIMIT = 1
    settings.BROKER_BROADCAST_BURST = 1
    before = snapshot()

    refused = broadcast(client, "audit", AUDIT_AS_SHOP)

    assert refused.status_code == 403
    assert refused.json() == {"Error": REFUSAL}
    assert snapshot() == before  # no message, and the producer's bucket untouched
    assert broadcast(client, "orders", ORDERS_AS_SHOP).status_code == 201


def test_bound_an_offloaded_payload_is_refused_and_not_kept(client, bound, settings, tmp_path):
    configured = settings.STORAGES["broker_payloads"]
    location = tmp_path / "payloads"
    settings.STORAGES = {
        **settings.STORAGES,
        "broker_payloads": {
            **configured,
            "OPTIONS": {**configured["OPTIONS"], "location": location},
        },
    }
    settings.BROKER_PAYLOAD_OFFLOAD_BYTES = 16
    body = json.dumps({"padding": "x" * 100}).encode()

    refused = broadcast(client, "audit", AUDIT_AS_SHOP, body)

    assert refused.status_code == 403
    assert not Message.objects.exists()
    assert not location.exists() or not any(location.iterdir())


def test_bound_a_scheduled_broadcast_is_refused(client, bound):
    later = (timezone.now() + timedelta(hours=1)).isoformat()

    refused = broadcast(client, "audit", AUDIT_AS_SHOP | {"X-Broker-Scheduled-For": later})
    allowed = broadcast(client, "orders", ORDERS_AS_SHOP | {"X-Broker-Scheduled-For": later})

    assert refused.status_code == 403
    assert refused.json() == {"Error": REFUSAL}
    assert allowed.status_code == 201
    stored = Message.objects.get()
    assert (stored.channel_id, stored.status) == ("orders", Message.Status.SCHEDULED)


def test_bound_a_batch_is_refused_whole(client, bound):
    refused = broadcast_batch(client, "audit", AUDIT_AS_SHOP)
    allowed = broadcast_batch(client, "orders", ORDERS_AS_SHOP)

    assert refused.status_code == 403
    assert refused.json() == {"Error": REFUSAL}
    assert allowed.status_code == 201
    assert set(Message.objects.values_list("channel_id", flat=True)) == {"orders"}


@pytest.mark.django_db(transaction=True)
def test_a_server_started_bound_refuses_the_consumer_over_real_http():
    """gunicorn configured by the environment alone, as an operator turns the rule on."""
    body = b'{"n": 1}'
    json_type = {"Content-Type": "application/json"}

    with running_api(BROKER_PRODUCER_CHANNELS="bound") as server:
        refused = server.request(
            "POST", "/channel/audit/broadcast", body, AUDIT_AS_SHOP | json_type
        )
        allowed = server.request(
            "POST", "/channel/orders/broadcast", body, ORDERS_AS_SHOP | json_type
        )

    assert (refused.status, allowed.status) == (403, 201)
    assert json.loads(refused.body) == {"Error": REFUSAL}
    assert list(Message.objects.values_list("channel_id", flat=True)) == ["orders"]
