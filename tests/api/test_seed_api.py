"""`POST /seed` (issue 39; docs/api.md, "Seed files"): a seed file loaded over the API with the
parser and the transaction `manage.py load_seed` uses, for the command line's `seed load`."""

from __future__ import annotations

import pytest

from broker.models import Channel
from consumers.models import Consumer
from tests.publishing.test_seed import GOOD_SEED, TOKENLESS_SEED, snapshot

pytestmark = pytest.mark.django_db


def post_seed(client, text: str | bytes):
    return client.post("/seed", text, content_type="text/plain")


def test_a_seed_file_is_loaded_and_each_resource_answered(admin_client):
    response = post_seed(admin_client, GOOD_SEED)

    assert response.status_code == 200
    loaded = response.json()["Loaded"]
    assert "channel orders: created" in loaded
    assert "consumer orders/billing: created" in loaded
    assert Consumer.objects.get(public_id="billing").token == "billing-token"
    [token_line] = [line for line in loaded if line.startswith("channel Audit_Log-2: token ")]
    assert Channel.objects.get(pk="Audit_Log-2").check_token(token_line.rsplit(" ", 1)[1])
    again = post_seed(admin_client, GOOD_SEED).json()["Loaded"]
    assert sum("unchanged" in line for line in again) == 5
    assert not [line for line in again if ": token " in line]  # shown once


def test_generated_tokens_are_answered_once(admin_client):
    loaded = post_seed(admin_client, TOKENLESS_SEED).json()["Loaded"]

    assert sum(": token " in line for line in loaded) == 3


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            GOOD_SEED.replace("channel=orders", "channel=nowhere", 1),
            "[billing] channel: 'nowhere' is not listed",
        ),
        (GOOD_SEED.replace("type=pull", "type=poll"), "[auditor] type: 'poll' is not push or pull"),
        (b"[initial-channels]\norders=\xff\n", "The seed file is not UTF-8."),
    ],
)
def test_a_bad_file_is_400_naming_the_problem_and_loads_nothing(admin_client, text, problem):
    response = post_seed(admin_client, text)

    assert response.status_code == 400
    assert problem in response.json()["Error"]
    assert snapshot() == []


def test_loading_a_seed_needs_an_admin(client):
    assert post_seed(client, GOOD_SEED).status_code == 401
    assert snapshot() == []
