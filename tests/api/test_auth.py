"""Admin authentication of the API (docs/api.md): tokens, API keys, staff sessions, open mode."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command

from broker.models import Producer
from tests.conftest import FORM
from tests.helpers import make_channel, make_consumer, make_operator

pytestmark = pytest.mark.django_db

ADMIN_URLS = ["/producers", "/channels", "/dlq-status", "/job-status", "/channel/orders"]


@pytest.fixture(autouse=True)
def channel():
    return make_channel()


@pytest.mark.parametrize("url", ADMIN_URLS)
def test_admin_endpoints_refuse_anonymous_callers(client, url):
    response = client.get(url)

    assert response.status_code == 401
    assert response.json() == {
        "Error": "Authentication credentials were not provided.",
    }
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("url", ADMIN_URLS)
def test_configured_admin_tokens_are_accepted(client, settings, url):
    settings.BROKER_ADMIN_TOKENS = ["first-token", "second-token"]

    response = client.get(url, headers={"Authorization": "Bearer second-token"})

    assert response.status_code == 200


@pytest.mark.parametrize("header", ["Bearer wrong-token", "Bearer ", "bearer first-toke"])
def test_wrong_admin_tokens_are_refused(client, settings, header):
    settings.BROKER_ADMIN_TOKENS = ["first-token"]

    response = client.get("/producers", headers={"Authorization": header})

    assert response.status_code == 401
    assert "first-token" not in response.content.decode()


def test_api_keys_from_the_management_command_work_until_revoked(client):
    out = io.StringIO()
    call_command("create_api_key", "deploy-bot", stdout=out)
    key = out.getvalue().strip()
    headers = {"Authorization": f"Bearer {key}"}

    assert client.get("/producers", headers=headers).status_code == 200

    call_command("revoke_api_key", "deploy-bot", stdout=io.StringIO())
    assert client.get("/producers", headers=headers).status_code == 401


def test_api_key_names_are_unique_and_revoking_an_unknown_key_fails():
    call_command("create_api_key", "deploy-bot", stdout=io.StringIO())

    with pytest.raises(CommandError, match="exists"):
        call_command("create_api_key", "deploy-bot", stdout=io.StringIO())
    with pytest.raises(CommandError, match="No API key"):
        call_command("revoke_api_key", "nobody", stdout=io.StringIO())


def test_sessions_need_staff_and_the_administer_broker_permission(client):
    user = User.objects.create_user("someone", password="pw")
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    allowed = User.objects.create_user("allowed", password="pw", is_staff=True)
    allowed.user_permissions.add(Permission.objects.get(codename="administer_broker"))

    for refused in (user, staff):
        client.force_login(refused)
        response = client.get("/producers")
        assert response.status_code == 403
        assert "broker.administer_broker" in response.json()["Error"]
    for admin in (allowed, make_operator(), User.objects.create_superuser("root", password="pw")):
        client.force_login(admin)
        assert client.get("/producers").status_code == 200


def test_a_session_without_the_permission_cannot_write_or_read_secrets(client):
    consumer = make_consumer(make_channel("payments"), "billing")
    client.force_login(User.objects.create_user("staff", password="pw", is_staff=True))
    path = "/channel/payments/consumer/billing"

    assert client.get(f"{path}/secret").status_code == 403
    assert client.post(f"{path}/secret").status_code == 403
    assert client.post(f"{path}/pause").status_code == 403
    assert client.put("/producer/shop", "name=Shop", content_type=FORM).status_code == 403
    response = client.post(f"{path}/dlq", "requeue=", content_type=FORM)
    assert response.status_code == 400  # an admin may requeue without the token; not this user
    after = type(consumer).objects.get(pk=consumer.pk)
    assert not after.paused
    assert after.signing_secret == consumer.signing_secret
    assert not Producer.objects.exists()


def test_staff_session_writes_need_the_csrf_token(settings):
    from django.test import Client

    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(make_operator())

    response = csrf_client.put(
        "/producer/shop", "name=Shop", content_type="application/x-www-form-urlencoded"
    )

    assert response.status_code == 403
    assert "CSRF" in response.json()["Error"]


def test_open_admin_api_restores_webhook_brokers_behaviour(client, settings):
    settings.BROKER_OPEN_ADMIN_API = True

    assert client.get("/producers").status_code == 200
