"""The delivery rate limit and 429 throttling as a consumer's settings (docs/api.md): the API's
`maxPerSecond` / `MaxPerSecond` and `ThrottledUntil`, the seed key, the admin. The UI form:
tests/ui/test_consumers.py; the limit at work: tests/queue/test_rate_limit.py."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest

from broker.seed import SeedError, apply_seed, parse_seed
from consumers.models import Consumer
from tests.conftest import FORM

pytestmark = pytest.mark.django_db
URL = "/channel/orders/consumer/billing"


def put(admin_client, **fields):
    """The consumer PUT, as a client that read the consumer first (If-Unmodified-Since)."""
    current = admin_client.get(URL)
    found = current.status_code == 200
    headers = {"If-Unmodified-Since": current["Last-Modified"]} if found else {}
    body = urlencode({"callbackUrl": "http://127.0.0.1:9/hook", **fields})
    return admin_client.put(URL, body, content_type=FORM, headers=headers)


def test_the_api_sets_shows_keeps_and_clears_the_limit(admin_client, channel):
    assert put(admin_client).json()["MaxPerSecond"] is None  # absent: no limit

    assert put(admin_client, maxPerSecond="20").json()["MaxPerSecond"] == 20
    assert put(admin_client).json()["MaxPerSecond"] == 20  # omitted: kept
    assert put(admin_client, maxPerSecond="0.5").json()["MaxPerSecond"] == 0.5
    assert put(admin_client, maxPerSecond="").json()["MaxPerSecond"] is None
    assert Consumer.objects.get().max_per_second is None


@pytest.mark.parametrize(
    "value", ["0", "-1", "twenty", "NaN", "Infinity", "1e9", "1,5", "0.0009", "1e-13", "1e-400"]
)
def test_a_bad_limit_is_a_400_naming_the_field_and_changes_nothing(admin_client, channel, value):
    put(admin_client, maxPerSecond="20")

    response = put(admin_client, maxPerSecond=value)

    assert response.status_code == 400
    assert response.json()["Error"].startswith("maxPerSecond: ")
    assert "a decimal number from 0.001 to 100000" in response.json()["Error"]
    assert Consumer.objects.get().max_per_second == 20


def test_a_new_limit_applies_at_once_not_after_the_slots_booked_at_the_old_one(
    admin_client, channel
):
    put(admin_client, maxPerSecond="0.01")  # one request in 100 s
    booked = datetime(2030, 1, 1, tzinfo=UTC)
    Consumer.objects.update(next_slot_at=booked)

    put(admin_client, maxPerSecond="0.01")  # unchanged: the booking stands
    assert Consumer.objects.get().next_slot_at == booked
    put(admin_client, maxPerSecond="50")
    assert Consumer.objects.get().next_slot_at is None


def test_the_consumer_json_shows_when_a_429_holds_it_back(admin_client, channel):
    put(admin_client)
    until = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    Consumer.objects.update(throttled_until=until)

    shown = admin_client.get(URL).json()

    assert datetime.fromisoformat(shown["ThrottledUntil"]) == until


SEED = """
[initial-channels]
orders = Orders
[initial-consumers]
billing = http://127.0.0.1:9/hook
[billing]
channel = orders
maxPerSecond = 12.5
"""


def test_the_seed_sets_the_limit():
    apply_seed(parse_seed(SEED))
    assert Consumer.objects.get().max_per_second == 12.5

    apply_seed(parse_seed(SEED.replace("12.5", "")))  # blank: no limit
    assert Consumer.objects.get().max_per_second is None

    with pytest.raises(SeedError, match=r"\[billing\] maxPerSecond: .*a decimal number from"):
        parse_seed(SEED.replace("12.5", "0"))


def test_the_admin_applies_the_apis_bounds(channel):
    data = {
        "channel": "orders",
        "public_id": "billing",
        "name": "Billing",
        "callback_url": "http://127.0.0.1:9/hook",
        "type": "push",
        "ordering": "none",
        "non_retryable_statuses": "[]",
        "event_types": "[]",
        "max_per_second": "-3",
        "circuit_failures": "0",
    }
    form = admin_form(data)

    assert not form.is_valid()
    assert "maxPerSecond: a decimal number from 0.001" in form.errors["max_per_second"][0]
    assert admin_form({**data, "max_per_second": "20"}).errors.get("max_per_second") is None


def admin_form(data: dict[str, str]):
    """The admin's form for consumers, as ModelAdmin builds it for a superuser."""
    from django.contrib import admin
    from django.contrib.auth.models import User
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/")
    request.user = User(is_superuser=True, is_staff=True)
    return admin.site._registry[Consumer].get_form(request)(data)
