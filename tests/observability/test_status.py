"""GET /_status: database health and version, and no secrets."""

from __future__ import annotations

import pytest
from django.db import connection

import broker
from broker.apps import close_connection_pools
from tests.helpers import make_channel


@pytest.mark.django_db
def test_status_reports_a_healthy_database(client):
    response = client.get("/_status")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["version"] == broker.__version__
    assert body["database"]["healthy"] is True
    assert body["database"]["vendor"] == connection.vendor
    assert response["Cache-Control"].startswith("max-age=0")


@pytest.mark.django_db
def test_status_shows_no_secret(client, settings):
    settings.SECRET_KEY = "a-very-secret-key-value-0123456789-abcdefghijklmnop"
    settings.BROKER_ADMIN_TOKENS = ["admin-token-value"]
    make_channel(token="channel-token-value")

    text = client.get("/_status").content.decode()

    for secret in ("a-very-secret-key", "admin-token-value", "channel-token-value", "postgres://"):
        assert secret not in text
    assert connection.settings_dict["NAME"] not in text


@pytest.mark.django_db
def test_status_accepts_only_get(client):
    assert client.post("/_status").status_code == 405


@pytest.mark.django_db(transaction=True)
def test_status_answers_503_when_the_database_is_unreachable(client, monkeypatch):
    connection.close()
    monkeypatch.setitem(connection.settings_dict, "PORT", "1")  # nothing listens there
    pool = connection.settings_dict["OPTIONS"].get("pool")
    if pool:
        # The pool was made for the real port: a new one for port 1, that waits only briefly
        # for a connection before the request gives up.
        monkeypatch.setitem(connection.settings_dict["OPTIONS"], "pool", {**pool, "timeout": 0.5})
        close_connection_pools()
    try:
        response = client.get("/_status")
    finally:
        connection.close()
        if pool:
            close_connection_pools()  # the next query makes one for the real port again

    assert response.status_code == 503
    assert response.json()["status"] == "unavailable"
    assert response.json()["database"]["healthy"] is False


@pytest.mark.django_db
def test_status_can_be_restricted_to_admins(client, settings):
    settings.BROKER_PUBLIC_STATUS = False
    settings.BROKER_ADMIN_TOKENS = ["admin-token"]

    assert client.get("/_status").status_code == 401
    response = client.get("/_status", headers={"Authorization": "Bearer admin-token"})
    assert response.status_code == 200
