"""Hand-written hostile input (issue 9): never a 5xx, always the JSON error shape, and a refused
request changes nothing.

What schemathesis (tests/api/test_fuzz.py) does not think of: huge headers, invalid UTF-8 in every
part of a request, JSON nested 100,000 deep, odd charsets, unknown and repeated fields, IDs that
look like SQL, tampered pagination cursors, oversized bodies, and Host header games. Each case
runs through the whole Django stack (middleware, DRF, the exception handler) against PostgreSQL;
tests/reliability/test_gunicorn_errors.py sends the huge headers to a real gunicorn as well.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import signing
from django.db import connection
from django.utils import timezone

from broker import publish
from broker.api.pagination import CURSOR_SALT
from broker.models import Channel, Message, Producer
from consumers.models import Consumer
from jobs.models import Job
from jobs.queue import take_for_pull
from tests.conftest import ADMIN_TOKEN, FORM
from tests.db_snapshot import snapshot
from tests.helpers import (
    BROADCAST_HEADERS,
    PULL_HEADERS,
    make_channel,
    make_consumer,
    make_consumer_with_token,
    make_producer,
)

pytestmark = pytest.mark.django_db

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WORKER = "/channel/orders/consumer/worker"
MEGABYTE = 1024 * 1024
DEEP_JSON = b"[" * 100_000 + b"]" * 100_000
SQL = ["' OR '1'='1", "1; DROP TABLE broker_channel; --", "orders' --", '" OR ""="', "1 OR 1=1"]


@dataclass
class Bad:
    """A request that must be refused with one of `statuses` (all 4xx) and change nothing."""

    name: str
    method: str
    path: str
    body: bytes = b""
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    statuses: tuple[int, ...] = (400,)

    def __str__(self) -> str:
        return self.name


@pytest.fixture(autouse=True)
def broker_rows(settings):
    """A channel with a push and a pull consumer, 30 messages and a dead job of each."""
    settings.BROKER_ADMIN_TOKENS = [ADMIN_TOKEN]
    channel = make_channel()
    make_producer()
    make_consumer(channel, "billing")
    make_consumer_with_token(channel, "worker")
    for number in range(30):
        publish(channel, b'{"n": 1}', producer="shop", message_id=f"m-{number}")
    for job in Job.objects.filter(message__public_id="m-0"):
        take_for_pull(job)
        job.mark_dead("for the test")


def send(client, case: Bad):
    return client.generic(
        case.method,
        case.path.replace("{job}", worker_job().public_id),
        case.body,
        content_type=case.content_type or "application/octet-stream",
        headers=case.headers,
    )


def worker_job() -> Job:
    """A QUEUED job of the pull consumer: the target of the transition cases."""
    return Job.objects.get(message__public_id="m-1", consumer__public_id="worker")


def assert_json_error(response) -> None:
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    body = json.loads(response.content)
    assert set(body) == {"Error"}, body
    assert isinstance(body["Error"], str)


def assert_refused_and_unchanged(client, case: Bad) -> None:
    before = snapshot()
    response = send(client, case)
    assert response.status_code in case.statuses, (response.status_code, response.content[:300])
    assert_json_error(response)
    assert snapshot() == before


def last_modified(model, **lookup) -> str:
    from broker.api.conditional import last_modified as http_date

    return http_date(model.objects.get(**lookup).changed_at)


# --- huge headers -------------------------------------------------------------------------------

HUGE = "x" * MEGABYTE

HUGE_HEADERS = [
    Bad(
        "huge bearer",
        "GET",
        "/producers",
        headers={"Authorization": f"Bearer {HUGE}"},
        statuses=(401,),
    ),
    Bad(
        "huge authorization scheme",
        "GET",
        "/producers",
        headers={"Authorization": HUGE},
        statuses=(401,),
    ),
    Bad(
        "huge channel token",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        headers={**BROADCAST_HEADERS, "X-Broker-Channel-Token": HUGE},
        statuses=(403,),
    ),
    Bad(
        "huge producer ID",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        headers={**BROADCAST_HEADERS, "X-Broker-Producer-ID": HUGE},
        statuses=(401,),
    ),
    Bad(
        "huge producer token",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        headers={**BROADCAST_HEADERS, "X-Broker-Producer-Token": HUGE},
        statuses=(403,),
    ),
    Bad(
        "huge message ID",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        headers={**BROADCAST_HEADERS, "X-Broker-Message-ID": HUGE},
    ),
    Bad(
        "huge priority",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        headers={**BROADCAST_HEADERS, "X-Broker-Message-Priority": "9" * 100_000},
    ),
    Bad(
        "huge schedule",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        headers={**BROADCAST_HEADERS, "X-Broker-Scheduled-For": HUGE},
    ),
    Bad(
        "huge ordering key",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        headers={**BROADCAST_HEADERS, "X-Broker-Ordering-Key": HUGE},
    ),
    Bad(
        "huge metadata header",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        headers={**BROADCAST_HEADERS, "X-Broker-Metadata-Headers": "X-Big", "X-Big": HUGE},
    ),
    Bad(
        "metadata naming 200 headers",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        headers={
            **BROADCAST_HEADERS,
            "X-Broker-Metadata-Headers": ",".join(f"X-H{n}" for n in range(200)),
            **{f"X-H{n}": "v" for n in range(200)},
        },
    ),
    Bad(
        "huge consumer token",
        "GET",
        f"{WORKER}/queued-jobs",
        headers={**PULL_HEADERS, "X-Broker-Consumer-Token": HUGE},
        statuses=(403,),
    ),
    Bad(
        "huge If-Unmodified-Since",
        "PUT",
        "/producer/shop",
        b"name=x",
        FORM,
        {**ADMIN, "If-Unmodified-Since": HUGE},
        statuses=(400, 412),
    ),
    Bad(
        "huge session cookie",
        "GET",
        "/producers",
        headers={"Cookie": f"sessionid={HUGE}"},
        statuses=(401,),
    ),
    Bad(
        "huge content type",
        "PUT",
        "/producer/newbie",
        b"name=x",
        "application/" + HUGE,
        ADMIN,
        statuses=(415,),
    ),
]


@pytest.mark.parametrize("case", HUGE_HEADERS, ids=str)
def test_huge_headers(client, case):
    assert_refused_and_unchanged(client, case)


# --- invalid UTF-8 and odd charsets --------------------------------------------------------------

INVALID_UTF8 = [
    Bad("path ID", "GET", "/channel/%FF%FE", headers=ADMIN, statuses=(400, 404)),
    Bad("PUT path ID", "PUT", "/producer/%C3%28", b"name=x", FORM, ADMIN),
    Bad("status query", "GET", "/channel/orders/messages?status=%FF", headers=ADMIN),
    Bad("cursor query", "GET", "/channel/orders/messages?next=%FF%FE", headers=ADMIN),
    Bad(
        "producer ID header",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        headers={**BROADCAST_HEADERS, "X-Broker-Producer-ID": "sh\xf6p"},
        statuses=(401,),
    ),
    Bad(
        "token header",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        headers={**BROADCAST_HEADERS, "X-Broker-Channel-Token": "\xff\xfe"},
        statuses=(403,),
    ),
    Bad(
        "claim JSON",
        "POST",
        f"{WORKER}/claim",
        b'{"limit": "\xff"}',
        "application/json",
        PULL_HEADERS,
    ),
    Bad(
        "transition JSON",
        "POST",
        f"{WORKER}/job/{{job}}",
        b'{"NextState": "\xc3\x28"}',
        "application/json",
        PULL_HEADERS,
        statuses=(400, 404),
    ),
    Bad(
        "form in base64 codec",
        "PUT",
        "/channel/orders/consumer/newbie",
        b"callbackUrl=x",
        f"{FORM}; charset=base64",
        ADMIN,
        statuses=(400, 415),
    ),
    Bad(
        "form in an unknown charset",
        "PUT",
        "/channel/orders/consumer/newbie",
        b"callbackUrl=x",
        f"{FORM}; charset=no-such-codec",
        ADMIN,
    ),
]


@pytest.mark.parametrize("case", INVALID_UTF8, ids=str)
def test_invalid_utf8_and_odd_charsets(client, case):
    assert_refused_and_unchanged(client, case)


@pytest.mark.parametrize("charset", ["utf-16", "rot13", "zlib", "base64", "unicode_escape"])
def test_a_declared_charset_does_not_change_how_a_body_is_read(client, charset):
    """JSON has no charset parameter (RFC 8259) and forms are UTF-8 (WHATWG): the bodies are read
    as the bytes they are (broker/utf8_requests.py; issue 36, where `charset=unicode_escape` made
    a lone surrogate of `\\ud800`). They were refused before, by DRF's decoding."""
    # generic(): the test client's put() and post() would encode the bytes in the charset.
    form = client.generic(
        "PUT",
        "/producer/newbie",
        b"name=caf%C3%A9+%5Cud800",
        content_type=f"{FORM}; charset={charset}",
        headers=ADMIN,
    )
    claim = client.generic(
        "POST",
        f"{WORKER}/claim",
        b'{"limit": 0}',
        content_type=f"application/json; charset={charset}",
        headers=PULL_HEADERS,
    )

    assert form.status_code == 200, form.content
    assert Producer.objects.get(pk="newbie").name == "caf\u00e9 \\ud800"
    assert (claim.status_code, claim.json()) == (200, {"Result": []})


def test_a_form_body_that_is_not_utf8_is_read_as_latin1_not_a_500(client):
    """Django's QueryDict falls back to ISO-8859-1 for a body that is not UTF-8."""
    response = client.put("/producer/newbie", b"name=caf\xe9", content_type=FORM, headers=ADMIN)
    assert response.status_code == 200
    assert Producer.objects.get(pk="newbie").name == "caf\u00e9"


def test_a_callback_host_of_invalid_utf8_is_refused_in_production(client, settings):
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = False
    case = Bad(
        "callback URL",
        "PUT",
        "/channel/orders/consumer/newbie",
        b"callbackUrl=http://%FF%FE.example/",
        FORM,
        ADMIN,
    )
    assert_refused_and_unchanged(client, case)


def test_invalid_utf8_payloads_are_payloads(client):
    """A payload is bytes: anything goes, and comes back base64 in the message's JSON."""
    response = client.post(
        "/channel/orders/broadcast",
        b"\xff\xfe\x00",
        content_type="text/plain; charset=utf-8",
        headers={**BROADCAST_HEADERS, "X-Broker-Message-ID": "binary"},
    )
    assert response.status_code == 201
    shown = client.get("/channel/orders/message/binary", headers=ADMIN).json()
    assert (shown["Payload"], shown["PayloadEncoding"]) == ("//4A", "base64")


# --- JSON shapes ---------------------------------------------------------------------------------

JSON_BODIES = [
    Bad(
        "claim nested 100,000 deep",
        "POST",
        f"{WORKER}/claim",
        DEEP_JSON,
        "application/json",
        PULL_HEADERS,
    ),
    Bad(
        "claim object nested deep",
        "POST",
        f"{WORKER}/claim",
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        "application/json",
        PULL_HEADERS,
    ),
    Bad(
        "transition nested deep",
        "POST",
        f"{WORKER}/job/{{job}}",
        DEEP_JSON,
        "application/json",
        PULL_HEADERS,
        statuses=(400, 404),
    ),
    Bad(
        "claim with a huge number",
        "POST",
        f"{WORKER}/claim",
        b'{"limit": 1' + b"0" * 5000 + b"}",
        "application/json",
        PULL_HEADERS,
    ),
    Bad(
        "claim with NaN",
        "POST",
        f"{WORKER}/claim",
        b'{"limit": NaN}',
        "application/json",
        PULL_HEADERS,
    ),
    Bad(
        "claim with a float",
        "POST",
        f"{WORKER}/claim",
        b'{"limit": 1e400}',
        "application/json",
        PULL_HEADERS,
    ),
    Bad(
        "claim with a list", "POST", f"{WORKER}/claim", b"[1, 2]", "application/json", PULL_HEADERS
    ),
    Bad(
        "claim with a string",
        "POST",
        f"{WORKER}/claim",
        b'"limit"',
        "application/json",
        PULL_HEADERS,
    ),
    Bad(
        "transition to nowhere",
        "POST",
        f"{WORKER}/job/{{job}}",
        b'{"NextState": "EVERYWHERE"}',
        "application/json",
        PULL_HEADERS,
    ),
    Bad(
        "transition with a negative timeout",
        "POST",
        f"{WORKER}/job/{{job}}",
        b'{"NextState": "INFLIGHT", "IncrementalTimeout": -5}',
        "application/json",
        PULL_HEADERS,
    ),
    Bad(
        "transition with a huge timeout",
        "POST",
        f"{WORKER}/job/{{job}}",
        b'{"NextState": "INFLIGHT", "IncrementalTimeout": 99999999999999999999}',
        "application/json",
        PULL_HEADERS,
    ),
    Bad(
        "truncated JSON", "POST", f"{WORKER}/claim", b'{"limit": ', "application/json", PULL_HEADERS
    ),
    Bad(
        "1 MB of JSON",
        "POST",
        f"{WORKER}/claim",
        b'{"limit": "' + b"9" * MEGABYTE + b'"}',
        "application/json",
        PULL_HEADERS,
    ),
]


@pytest.mark.parametrize("case", JSON_BODIES, ids=str)
def test_hostile_json(client, case):
    assert_refused_and_unchanged(client, case)


def test_unknown_fields_are_ignored_and_repeated_ones_take_the_last(client):
    response = client.put(
        "/channel/orders/consumer/newbie",
        "callbackUrl=http://127.0.0.1:9/a&callbackUrl=http://127.0.0.1:9/b&isAdmin=true&id=7"
        "&channel=other&Token=",
        content_type=FORM,
        headers=ADMIN,
    )
    assert response.status_code == 200
    consumer = Consumer.objects.get(public_id="newbie")
    assert consumer.callback_url == "http://127.0.0.1:9/b"
    assert consumer.channel_id == "orders"
    assert "isAdmin" not in response.json()


def test_unknown_json_fields_change_nothing_beyond_the_transition(client):
    job = Job.objects.get(message__public_id="m-1", consumer__public_id="worker")
    response = client.post(
        f"{WORKER}/job/{job.public_id}",
        {"NextState": "INFLIGHT", "Attempts": 0, "Status": "DELIVERED", "consumer_id": 1},
        content_type="application/json",
        headers=PULL_HEADERS,
    )
    assert response.status_code == 202
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("INFLIGHT", 1)


# --- IDs that look like SQL ----------------------------------------------------------------------


def _sql_cases() -> list[Bad]:
    from urllib.parse import quote

    cases = []
    for number, text in enumerate(SQL):
        quoted = quote(text, safe="")
        cases += [
            Bad(
                f"channel path {number}",
                "GET",
                f"/channel/{quoted}",
                headers=ADMIN,
                statuses=(400, 404),
            ),
            Bad(f"producer PUT {number}", "PUT", f"/producer/{quoted}", b"name=x", FORM, ADMIN),
            Bad(
                f"message path {number}",
                "GET",
                f"/channel/orders/message/{quoted}",
                headers=ADMIN,
                statuses=(404,),
            ),
            Bad(
                f"job path {number}",
                "GET",
                f"{WORKER}/job/{quoted}",
                headers=PULL_HEADERS,
                statuses=(404,),
            ),
            Bad(
                f"consumer DELETE {number}",
                "DELETE",
                f"/channel/orders/consumer/{quoted}",
                headers=ADMIN,
                statuses=(400, 404),
            ),
            Bad(
                f"status query {number}",
                "GET",
                f"/channel/orders/messages?status={quoted}",
                headers=ADMIN,
            ),
            Bad(
                f"producer header {number}",
                "POST",
                "/channel/orders/broadcast",
                b"x",
                headers={**BROADCAST_HEADERS, "X-Broker-Producer-ID": text},
                statuses=(401,),
            ),
            Bad(
                f"bearer {number}",
                "GET",
                "/producers",
                headers={"Authorization": f"Bearer {text}"},
                statuses=(401,),
            ),
        ]
    return cases


@pytest.mark.parametrize("case", _sql_cases(), ids=str)
def test_sql_looking_ids(client, case):
    assert_refused_and_unchanged(client, case)


def test_like_wildcards_are_plain_characters(client):
    """webhook-broker matches IDs with LIKE; here `_` is a character and `%` is invalid."""
    assert client.get("/channel/_rders", headers=ADMIN).status_code == 404
    assert client.get("/channel/%25", headers=ADMIN).status_code in (400, 404)
    assert client.get("/channel/orders/message/m-_", headers=ADMIN).status_code == 404


def test_a_message_id_that_looks_like_sql_is_refused_or_stored_verbatim(client):
    tables_before = set(connection.introspection.table_names())
    for number, text in enumerate(SQL):
        response = client.post(
            "/channel/orders/broadcast",
            b"x",
            content_type="text/plain",
            headers={
                **BROADCAST_HEADERS,
                "X-Broker-Message-ID": text,
                "X-Broker-Ordering-Key": text,
            },
        )
        assert response.status_code in (201, 400), (number, response.content)
        if response.status_code == 201:
            assert Message.objects.get(public_id=text).ordering_key == text
        else:
            assert_json_error(response)
    assert set(connection.introspection.table_names()) == tables_before
    assert Channel.objects.filter(pk="orders").exists()


# --- pagination cursors --------------------------------------------------------------------------


def next_cursor(client, path: str) -> str:
    page = client.get(path, headers=ADMIN).json()
    return str(parse_qs(urlsplit(page["Pages"]["next"]).query)["next"][0])


def test_a_real_cursor_works(client):
    cursor = next_cursor(client, "/channel/orders/messages")
    response = client.get("/channel/orders/messages", {"next": cursor}, headers=ADMIN)
    assert response.status_code == 200
    assert len(response.json()["Result"]) == 5


def _signed(value: object, salt: str = CURSOR_SALT) -> str:
    """Signed with the broker's own key, as the API signs its cursors."""
    return signing.Signer(salt=salt).sign_object(value, compress=True)


def _tampered(cursor: str) -> list[str]:
    value, _, signature = cursor.rpartition(":")
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    return [
        f"{value}:{flipped}",  # signature changed
        f"{value[:-1]}{'A' if value[-1] != 'A' else 'B'}:{signature}",  # payload changed
        value,  # signature dropped
        _signed(["2030-01-01T00:00:00+00:00", "1"], salt="another-salt"),
        _signed(["not a date", "1"]),  # right key, wrong shape
        _signed(["2030-01-01T00:00:00+00:00"]),
        _signed({"a": 1}),
        _signed(["2030-01-01T00:00:00+00:00", "x" * 10_000]),
        # Signed as a cursor used to be (with a time stamp): no longer a valid cursor.
        signing.dumps(["2030-01-01T00:00:00+00:00", "1"], salt=CURSOR_SALT, compress=True),
        "A" * 10_000,
        "' OR 1=1 --",
    ]


def test_tampered_cursors_are_400(client):
    cursor = next_cursor(client, "/channel/orders/messages")
    for number, bad in enumerate(_tampered(cursor)):
        for name in ("next", "previous"):
            case = Bad(
                f"{name} {number}",
                "GET",
                f"/channel/orders/messages?{name}={_q(bad)}",
                headers=ADMIN,
            )
            assert_refused_and_unchanged(client, case)


def test_a_cursor_from_another_list_is_400_or_a_page(client):
    for number in range(30):
        make_producer(f"p-{number}")
    producers_cursor = next_cursor(client, "/producers")
    response = client.get("/channel/orders/messages", {"next": producers_cursor}, headers=ADMIN)
    assert response.status_code in (200, 400)
    if response.status_code == 400:
        assert_json_error(response)


def test_next_and_previous_together_are_400(client):
    cursor = next_cursor(client, "/channel/orders/messages")
    case = Bad(
        "both",
        "GET",
        f"/channel/orders/messages?next={_q(cursor)}&previous={_q(cursor)}",
        headers=ADMIN,
    )
    assert_refused_and_unchanged(client, case)


def _q(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


# --- sizes, methods, hosts -----------------------------------------------------------------------

SIZES_AND_METHODS = [
    Bad(
        "6 MB form",
        "PUT",
        "/producer/newbie",
        b"name=" + b"x" * (6 * MEGABYTE),
        FORM,
        ADMIN,
        statuses=(413,),
    ),
    Bad(
        "20 MB anonymous DLQ form",
        "POST",
        f"{WORKER}/dlq",
        b"requeue=" + b"x" * (20 * MEGABYTE),
        FORM,
        statuses=(413,),
    ),
    Bad(
        "20 MB claim JSON",
        "POST",
        f"{WORKER}/claim",
        b'{"limit": "' + b"1" * (20 * MEGABYTE) + b'"}',
        "application/json",
        PULL_HEADERS,
        statuses=(413,),
    ),
    Bad(
        "2,000 form fields",
        "PUT",
        "/producer/newbie",
        b"&".join(b"f%d=1" % n for n in range(2000)),
        FORM,
        ADMIN,
        statuses=(400,),
    ),
    Bad(
        "6 MB broadcast",
        "POST",
        "/channel/orders/broadcast",
        b"x" * (6 * MEGABYTE),
        "text/plain",
        BROADCAST_HEADERS,
        statuses=(413,),
    ),
    Bad(
        "lying Content-Length",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        "text/plain",
        {**BROADCAST_HEADERS, "Content-Length": "abc"},
        statuses=(400,),
    ),
    Bad(
        "empty broadcast", "POST", "/channel/orders/broadcast", b"", "text/plain", BROADCAST_HEADERS
    ),
    Bad("name over 255", "PUT", "/producer/newbie", b"name=" + b"x" * 300, FORM, ADMIN),
    Bad("NUL in a name", "PUT", "/producer/newbie", b"name=a%00b", FORM, ADMIN),
    Bad("NUL in a path", "GET", "/channel/a%00b", headers=ADMIN, statuses=(404,)),
    Bad("256-character ID", "PUT", "/producer/" + "x" * 256, b"name=x", FORM, ADMIN),
    Bad(
        "JSON to a form endpoint",
        "PUT",
        "/producer/newbie",
        b'{"name": "x"}',
        "application/json",
        ADMIN,
        statuses=(415,),
    ),
    Bad("PATCH", "PATCH", "/producer/shop", b"name=x", FORM, ADMIN, statuses=(405,)),
    Bad("TRACE", "TRACE", "/producers", headers=ADMIN, statuses=(405,)),
    Bad("DELETE a channel", "DELETE", "/channel/orders", headers=ADMIN, statuses=(405,)),
    Bad("claim limit 10^6", "POST", f"{WORKER}/claim", b"limit=1000000", FORM, PULL_HEADERS),
    Bad("queued-jobs limit -1", "GET", f"{WORKER}/queued-jobs?limit=-1", headers=PULL_HEADERS),
    Bad(
        "stale If-Unmodified-Since",
        "PUT",
        "/producer/shop",
        b"name=x",
        FORM,
        {**ADMIN, "If-Unmodified-Since": "Thu, 01 Jan 1970 00:00:00 GMT"},
        statuses=(412,),
    ),
    Bad(
        "garbage If-Unmodified-Since",
        "PUT",
        "/producer/shop",
        b"name=x",
        FORM,
        {**ADMIN, "If-Unmodified-Since": "yesterday"},
        statuses=(400, 412),
    ),
    Bad(
        "schedule in the past",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        "text/plain",
        {**BROADCAST_HEADERS, "X-Broker-Scheduled-For": "2000-01-01T00:00:00Z"},
        statuses=(412,),
    ),
    Bad(
        "schedule in year 99999",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        "text/plain",
        {**BROADCAST_HEADERS, "X-Broker-Scheduled-For": "99999-01-01T00:00:00Z"},
    ),
    Bad(
        "priority 2^31",
        "POST",
        "/channel/orders/broadcast",
        b"x",
        "text/plain",
        {**BROADCAST_HEADERS, "X-Broker-Message-Priority": str(2**31)},
    ),
    Bad(
        "requeue DLQ with a wrong token",
        "POST",
        f"{WORKER}/dlq",
        b"requeue=wrong",
        FORM,
        statuses=(400, 401, 403),
    ),
]


@pytest.mark.parametrize("case", SIZES_AND_METHODS, ids=str)
def test_sizes_methods_and_values(client, case):
    assert_refused_and_unchanged(client, case)


@pytest.mark.parametrize("host", ["evil.example.com", "127.0.0.1:80@evil", "a" * 5000, "[::1"])
def test_unknown_hosts_are_400(client, host):
    case = Bad(f"host {host[:20]}", "GET", "/producers", headers={**ADMIN, "Host": host})
    assert_refused_and_unchanged(client, case)


def test_a_rejected_request_in_the_middle_of_good_ones_leaves_no_trace(client):
    """The same check once more on the write paths, with the state the good requests left."""
    changed = last_modified(Producer, pk="shop")
    good = client.put(
        "/producer/shop",
        "name=Shop 2",
        content_type=FORM,
        headers={**ADMIN, "If-Unmodified-Since": changed},
    )
    assert good.status_code == 200
    for case in [
        Bad(
            "stale",
            "PUT",
            "/producer/shop",
            b"name=Shop 3",
            FORM,
            {**ADMIN, "If-Unmodified-Since": changed},
            statuses=(412,),
        ),
        Bad(
            "scheduled too soon",
            "POST",
            "/channel/orders/broadcast",
            b"x",
            "text/plain",
            {
                **BROADCAST_HEADERS,
                "X-Broker-Scheduled-For": (timezone.now() + timedelta(seconds=5)).isoformat(),
            },
            statuses=(412, 400),
        ),
        Bad(
            "duplicate ID",
            "POST",
            "/channel/orders/broadcast",
            b"x",
            "text/plain",
            {**BROADCAST_HEADERS, "X-Broker-Message-ID": "m-3"},
            statuses=(409,),
        ),
    ]:
        assert_refused_and_unchanged(client, case)
