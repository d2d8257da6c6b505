"""`manage.py load_seed` for webhook-broker's INI seed format (docs/data-model.md, "Seed files")."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from broker.models import Channel, Producer
from consumers.models import Consumer

pytestmark = pytest.mark.django_db

GOOD_SEED = """
# webhook-broker's own settings live in the same file and are ignored here
[http]
listener=:8080

[initial-channels]
orders=Order events
Audit_Log-2=

[initial-channel-tokens]
orders=orders-channel-token

[initial-producers]
shop=The Shop

[initial-producer-tokens]
shop=shop-token

[initial-consumers]
billing=https://billing.example.com/hooks?x=1
auditor=http://audit.example.com:8080/in

[billing]
channel=orders
token=billing-token

[auditor]
channel=Audit_Log-2
type=pull
"""


def load(tmp_path: Path, text: str) -> str:
    path = tmp_path / "seed.cfg"
    path.write_text(text)
    out = io.StringIO()
    call_command("load_seed", str(path), stdout=out)
    return out.getvalue()


def printed_token(output: str, label: str) -> str:
    """The token load_seed printed for a resource (`channel orders`, `consumer orders/billing`)."""
    found: list[str] = re.findall(rf"^{re.escape(label)}: token (\S+)$", output, re.MULTILINE)
    assert len(found) == 1, output
    return found[0]


def snapshot() -> list[tuple[object, ...]]:
    return [
        *Channel.objects.order_by("pk").values_list("pk", "name", "token_hash", "changed_at"),
        *Producer.objects.order_by("pk").values_list("pk", "name", "token_hash", "changed_at"),
        *Consumer.objects.order_by("pk").values_list(
            "channel_id", "public_id", "callback_url", "type", "token", "changed_at"
        ),
    ]


def test_good_file_creates_everything(tmp_path):
    output = load(tmp_path, GOOD_SEED)

    orders = Channel.objects.get(pk="orders")
    assert orders.name == "Order events"
    assert orders.check_token("orders-channel-token")
    audit = Channel.objects.get(pk="Audit_Log-2")
    assert audit.name == "Audit_Log-2"  # an empty name falls back to the ID
    assert "channel Audit_Log-2: created\n" in output
    assert audit.check_token(printed_token(output, "channel Audit_Log-2"))
    shop = Producer.objects.get(pk="shop")
    assert (shop.name, shop.check_token("shop-token")) == ("The Shop", True)
    billing = Consumer.objects.get(channel=orders, public_id="billing")
    assert billing.callback_url == "https://billing.example.com/hooks?x=1"
    assert (billing.type, billing.token) == ("push", "billing-token")
    auditor = Consumer.objects.get(channel=audit, public_id="auditor")
    assert auditor.type == "pull"
    assert auditor.check_token(printed_token(output, "consumer Audit_Log-2/auditor"))
    # Only the tokens the file leaves out are printed (given ones are the operator's already).
    assert output.count(": token ") == 2


def test_reloading_the_same_file_changes_nothing(tmp_path):
    load(tmp_path, GOOD_SEED)
    before = snapshot()

    output = load(tmp_path, GOOD_SEED)

    assert snapshot() == before
    assert output.count("unchanged") == 5
    assert ": token " not in output  # generated tokens are kept, not rotated nor shown again


def test_reloading_an_edited_file_updates_what_changed(tmp_path):
    load(tmp_path, GOOD_SEED)
    edited = GOOD_SEED.replace("shop=shop-token", "shop=new-shop-token").replace(
        "http://audit.example.com:8080/in", "http://audit.example.com/v2"
    )

    output = load(tmp_path, edited)

    assert Producer.objects.get(pk="shop").check_token("new-shop-token")
    assert Consumer.objects.get(public_id="auditor").callback_url == "http://audit.example.com/v2"
    assert "producer shop: updated" in output
    assert "consumer Audit_Log-2/auditor: updated" in output
    assert "channel orders: unchanged" in output


def test_legacy_consumer_token_section_is_accepted(tmp_path):
    seed = GOOD_SEED + "\n[initial-consumer-tokens]\nauditor=legacy-token\n"

    load(tmp_path, seed)

    assert Consumer.objects.get(public_id="auditor").token == "legacy-token"


# --- Tokens the file leaves out: generated, printed once ----------------------------------------

FORM = "application/x-www-form-urlencoded"
TOKENLESS_SEED = """
[initial-channels]
orders=Orders

[initial-producers]
shop=Shop

[initial-consumers]
worker=http://worker.example.com/unused

[worker]
channel=orders
type=pull
"""


def test_printed_tokens_let_a_seeded_producer_publish_and_pull_consumer_claim(client, tmp_path):
    output = load(tmp_path, TOKENLESS_SEED)

    channel_token = printed_token(output, "channel orders")
    producer_token = printed_token(output, "producer shop")
    consumer_token = printed_token(output, "consumer orders/worker")
    assert len({channel_token, producer_token, consumer_token}) == 3
    assert min(map(len, [channel_token, producer_token, consumer_token])) >= 43  # 256 bits
    published = client.post(
        "/channel/orders/broadcast",
        b'{"order": 1}',
        content_type="application/json",
        headers={
            "X-Broker-Channel-Token": channel_token,
            "X-Broker-Producer-ID": "shop",
            "X-Broker-Producer-Token": producer_token,
            "X-Broker-Message-ID": "order-1",
        },
    )
    assert published.status_code == 201
    claim_url = "/channel/orders/consumer/worker/claim"
    wrong = {"X-Broker-Channel-Token": channel_token, "X-Broker-Consumer-Token": "guess"}
    assert client.post(claim_url, "", content_type=FORM, headers=wrong).status_code == 403

    pull_headers = {
        "X-Broker-Channel-Token": channel_token,
        "X-Broker-Consumer-Token": consumer_token,
    }
    claimed = client.post(claim_url, "", content_type=FORM, headers=pull_headers)

    assert claimed.status_code == 200
    assert [job["Message"]["MessageID"] for job in claimed.json()["Result"]] == ["order-1"]


def test_a_second_load_prints_no_token_and_the_first_ones_still_work(client, tmp_path):
    first = load(tmp_path, TOKENLESS_SEED)
    before = snapshot()

    output = load(tmp_path, TOKENLESS_SEED)

    assert output.splitlines() == [
        "channel orders: unchanged",
        "producer shop: unchanged",
        "consumer orders/worker: unchanged",
    ]
    assert snapshot() == before
    headers = {
        "X-Broker-Channel-Token": printed_token(first, "channel orders"),
        "X-Broker-Consumer-Token": printed_token(first, "consumer orders/worker"),
    }
    assert client.get("/channel/orders/consumer/worker/queued-jobs", headers=headers).json() == {
        "Result": []
    }


def test_an_existing_row_without_a_token_gets_one_printed(tmp_path):
    load(tmp_path, TOKENLESS_SEED)
    # Rows written without set_token (a data migration, a shell): no token can match them.
    Channel.objects.filter(pk="orders").update(token_hash="")
    Consumer.objects.filter(public_id="worker").update(token="")

    output = load(tmp_path, TOKENLESS_SEED)

    assert "channel orders: updated" in output
    assert "producer shop: unchanged" in output
    assert "consumer orders/worker: updated" in output
    assert Channel.objects.get(pk="orders").check_token(printed_token(output, "channel orders"))
    worker = Consumer.objects.get(public_id="worker")
    assert worker.check_token(printed_token(output, "consumer orders/worker"))
    assert output.count(": token ") == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("[initial-consumers]", "[initial-consumers]\nbad id=http://x.example.com"),
            "[initial-consumers] bad id: invalid ID",
        ),
        (
            ("billing=https://billing.example.com/hooks?x=1", "billing=ftp://x"),
            "[initial-consumers] billing: 'ftp://x' is not",
        ),
        (
            ("billing=https://billing.example.com/hooks?x=1", "billing=/relative"),
            "[initial-consumers] billing",
        ),
        (("channel=orders", "channel=nowhere"), "[billing] channel: 'nowhere' is not listed"),
        (("channel=orders\n", ""), "[billing] channel: missing"),
        (("type=pull", "type=poll"), "[auditor] type: 'poll' is not push or pull"),
        (("type=pull", "colour=blue"), "[auditor] colour: unknown key"),
        (("[auditor]", "[someone-else]"), "[initial-consumers] auditor: no [auditor] section"),
        (
            ("orders=orders-channel-token", "unknown=t"),
            "[initial-channel-tokens] unknown: not listed",
        ),
        (("shop=shop-token", "shop="), "[initial-producer-tokens] shop: empty token"),
        (("shop=The Shop", "shop=The Shop\nshop=Again"), "[initial-producers] shop: duplicate key"),
        (
            ("[initial-producers]", "[initial-producers]\nno-delimiter-here"),
            "[initial-producers]: line 14: expected key=value",
        ),
        (("[auditor]\n", "[billing]\n"), "[billing]: duplicate section"),
        (("# webhook", "stray=1\n# webhook"), "[file]"),
    ],
)
def test_a_bad_file_names_the_problem_and_loads_nothing(tmp_path, change, message):
    old, new = change
    assert old in GOOD_SEED
    bad = GOOD_SEED.replace(old, new, 1)

    with pytest.raises(CommandError) as error:
        load(tmp_path, bad)

    assert message in str(error.value)
    assert "nothing was loaded" in str(error.value)
    assert snapshot() == []


def test_a_bad_file_leaves_earlier_loads_untouched(tmp_path):
    load(tmp_path, GOOD_SEED)
    before = snapshot()
    bad = GOOD_SEED.replace("The Shop", "Renamed").replace("type=pull", "type=poll")

    with pytest.raises(CommandError):
        load(tmp_path, bad)

    assert snapshot() == before


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="Cannot read"):
        call_command("load_seed", str(tmp_path / "absent.cfg"))


# --- [initial-producer-channels] (ours: producers bound to channels) ---------------------------

BOUND_SEED = GOOD_SEED + "\n[initial-producer-channels]\nshop = orders, Audit_Log-2\n"


def allowed(producer_id: str) -> list[str]:
    producer = Producer.objects.get(pk=producer_id)
    return sorted(producer.allowed_channels.values_list("pk", flat=True))


def test_producer_channels_are_loaded_and_reloading_changes_nothing(tmp_path):
    load(tmp_path, BOUND_SEED)
    assert allowed("shop") == ["Audit_Log-2", "orders"]
    before = snapshot()

    output = load(tmp_path, BOUND_SEED)

    assert snapshot() == before
    assert "producer shop: unchanged" in output


def test_an_edited_entry_replaces_the_channels_and_no_entry_keeps_them(tmp_path):
    load(tmp_path, BOUND_SEED)

    edited = load(tmp_path, BOUND_SEED.replace("shop = orders, Audit_Log-2", "shop = orders"))
    assert "producer shop: updated" in edited
    assert allowed("shop") == ["orders"]

    output = load(tmp_path, GOOD_SEED)  # the section left out: the channels stay as they are
    assert "producer shop: unchanged" in output
    assert allowed("shop") == ["orders"]

    load(tmp_path, BOUND_SEED.replace("shop = orders, Audit_Log-2", "shop ="))
    assert allowed("shop") == []  # an empty entry: no channel


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("ghost = orders", "[initial-producer-channels] ghost: not listed in [initial-producers]"),
        (
            "shop = orders, nowhere",
            "[initial-producer-channels] shop: 'nowhere' is not listed in [initial-channels]",
        ),
        ("shop = orders, bad id!", "[initial-producer-channels] shop: 'bad id!' is not a channel"),
    ],
)
def test_a_bad_producer_channels_entry_names_it_and_loads_nothing(tmp_path, entry, message):
    bad = GOOD_SEED + f"\n[initial-producer-channels]\n{entry}\n"

    with pytest.raises(CommandError) as error:
        load(tmp_path, bad)

    assert message in str(error.value)
    assert snapshot() == []
