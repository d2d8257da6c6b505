"""A callback URL's secrets stay hidden (issue 36 §7): its userinfo and query values are masked
wherever a person or a log sees the URL: the admin's list and change form, the operator UI's
list, page and edit form, the seed command's errors. The edit forms never write the URL into the
page: a blank field keeps it, the masked text copied back is refused, a new URL replaces it.
The REST API, behind the admin token that sets the URL, gives it whole (docs/api.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from consumers.callback_url import masked_callback_url
from consumers.models import Consumer
from tests.conftest import ADMIN_TOKEN
from tests.helpers import make_channel, make_consumer

pytestmark = pytest.mark.django_db

SECRET_URL = "https://ops:s3cret-pass@hooks.example:8443/in/orders?token=t0ken-value&v=2#k3y"
MASKED = "https://ops:***@hooks.example:8443/in/orders?token=***&v=***#***"
SECRETS = ("s3cret-pass", "t0ken-value", "k3y")


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        (SECRET_URL, MASKED),
        ("https://hooks.example/in", "https://hooks.example/in"),
        ("http://api-key-only@hooks.example/in", "http://***@hooks.example/in"),  # a token
        ("http://u:p@ss@hooks.example/", "http://u:***@hooks.example/"),  # "@" in the password
        ("http://hooks.example/in?bare-token&flag=", "http://hooks.example/in?***&flag="),
        ("http://[::1]:8080/in?a=b", "http://[::1]:8080/in?a=***"),
        ("http://[::1/in?a=b", "***"),  # not even split: nothing is shown
    ],
)
def test_what_is_masked(url, masked):
    assert masked_callback_url(url) == masked


@pytest.fixture
def billing() -> Consumer:
    consumer = make_consumer(make_channel("orders"), "billing")
    consumer.callback_url = SECRET_URL
    consumer.save()
    return consumer


def assert_hidden(page: str) -> None:
    for secret in SECRETS:
        assert secret not in page
    assert MASKED in page.replace("&amp;", "&")


# --- the admin ---------------------------------------------------------------------------------

ADMIN_PAGE = "/admin/consumers/consumer"


def test_the_admin_shows_the_url_masked(superuser_client, billing):
    """The report: the list showed `user:password@` and the query string in clear."""
    assert_hidden(superuser_client.get(f"{ADMIN_PAGE}/").content.decode())
    assert_hidden(superuser_client.get(f"{ADMIN_PAGE}/{billing.pk}/change/").content.decode())


def admin_change(client, consumer: Consumer, new_callback_url: str):
    form = {
        "channel": consumer.channel_id,
        "public_id": consumer.public_id,
        "name": consumer.name,
        "new_callback_url": new_callback_url,
        "type": consumer.type,
        "ordering": consumer.ordering,
        "non_retryable_statuses": "",
        "event_types": "",
    }
    return client.post(f"{ADMIN_PAGE}/{consumer.pk}/change/", form)


def test_the_admin_keeps_replaces_or_refuses_the_url(superuser_client, billing):
    kept = admin_change(superuser_client, billing, "")
    assert kept.status_code == 302, kept.content.decode()[-2000:]
    assert Consumer.objects.get().callback_url == SECRET_URL

    copied = admin_change(superuser_client, billing, MASKED)
    assert copied.status_code == 200  # the form again, with the error
    assert "secrets masked" in copied.content.decode()
    assert Consumer.objects.get().callback_url == SECRET_URL

    replaced = admin_change(superuser_client, billing, "https://new.example/in?token=other")
    assert replaced.status_code == 302
    assert Consumer.objects.get().callback_url == "https://new.example/in?token=other"


def test_a_consumer_added_in_the_admin_needs_a_callback_url(superuser_client, billing):
    form = {
        "channel": "orders",
        "public_id": "audit",
        "name": "Audit",
        "type": "push",
        "ordering": "none",
        "non_retryable_statuses": "",
        "event_types": "",
    }

    refused = superuser_client.post(f"{ADMIN_PAGE}/add/", form)
    added = superuser_client.post(f"{ADMIN_PAGE}/add/", {**form, "new_callback_url": SECRET_URL})

    assert refused.status_code == 200
    assert "A new consumer needs a callback URL." in refused.content.decode()
    assert added.status_code == 302
    assert Consumer.objects.get(public_id="audit").callback_url == SECRET_URL


def test_the_admin_cannot_search_by_the_url(superuser_client, billing):
    """A search by substring would tell the secret a character at a time."""
    found = superuser_client.get(f"{ADMIN_PAGE}/", {"q": "s3cret"}).content.decode()

    assert f"/consumers/consumer/{billing.pk}/change/" not in found


# --- the operator UI ---------------------------------------------------------------------------

UI_PAGE = "/ui/consumers/orders/billing"


def test_the_ui_shows_the_url_masked(staff_client, billing):
    assert_hidden(staff_client.get("/ui/consumers").content.decode())
    assert_hidden(staff_client.get(UI_PAGE).content.decode())
    assert_hidden(staff_client.get(f"{UI_PAGE}/edit").content.decode())


def ui_edit(client, consumer: Consumer, callback_url: str):
    return client.post(
        f"{UI_PAGE}/edit",
        {
            "name": consumer.name,
            "callback_url": callback_url,
            "type": consumer.type,
            "ordering": consumer.ordering,
            "changed_at": Consumer.objects.get().changed_at.isoformat(),
        },
    )


def test_the_ui_keeps_replaces_or_refuses_the_url(staff_client, billing):
    assert ui_edit(staff_client, billing, "").status_code == 302
    assert Consumer.objects.get().callback_url == SECRET_URL

    copied = ui_edit(staff_client, billing, MASKED)
    assert copied.status_code == 400
    assert "secrets masked" in copied.content.decode()
    assert_hidden(copied.content.decode().replace(MASKED, "", 1))  # the refused text aside
    assert Consumer.objects.get().callback_url == SECRET_URL

    assert ui_edit(staff_client, billing, "https://new.example/in").status_code == 302
    assert Consumer.objects.get().callback_url == "https://new.example/in"


# --- logs and the API --------------------------------------------------------------------------


def test_the_seed_command_names_a_refused_url_masked(tmp_path: Path):
    seed = tmp_path / "seed.ini"
    seed.write_text(
        "[channels]\norders = Orders\n[initial-consumers]\n"
        "billing = ftp://ops:s3cret-pass@hooks.example/in?token=t0ken-value\n"
        "[billing]\nchannel = orders\n"
    )

    with pytest.raises(CommandError) as refused:
        call_command("load_seed", str(seed))

    assert "ftp://ops:***@hooks.example/in?token=***" in str(refused.value)
    assert "s3cret-pass" not in str(refused.value)


def test_the_api_gives_the_url_whole_to_the_admin_token(client, billing, settings):
    """Upstream's wire format, for the credential that sets the URL: a client that reads a
    consumer and writes it back must not write the mask."""
    settings.BROKER_ADMIN_TOKENS = [ADMIN_TOKEN]

    answer = client.get(
        "/channel/orders/consumer/billing", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )

    assert answer.json()["CallbackURL"] == SECRET_URL
