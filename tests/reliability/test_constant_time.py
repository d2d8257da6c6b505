"""Every token and secret comparison is constant-time (docs/api.md; docs/reliability.md).

Two guards: a scan of the source that fails on any `==`, `!=` or `in` whose operands name a
token, secret, signature, password, digest or hash (comparisons that return at the first
differing byte and so leak, through timing, how much of a guess was right); and a spy on
`hmac.compare_digest` proving that each way a credential reaches the broker ends there.
"""

from __future__ import annotations

import ast
import hmac
import re

import pytest

from broker.api.auth import admin_token_name
from broker.api.tokens import StoredToken
from broker.models import Channel
from broker.tokens import hash_token, secrets_equal, token_matches
from consumers.models import Consumer
from tests import ROOT
from tests.conftest import FORM
from tests.helpers import make_channel, make_consumer_with_token, make_producer

PACKAGES = ["broker", "consumers", "jobs", "ui"]
SECRET_NAME = re.compile(r"token|secret|signature|password|digest|hash|api_?key|credential", re.I)
TIMING_LEAKS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _identifiers(node: ast.AST) -> list[str]:
    return [
        sub.id if isinstance(sub, ast.Name) else sub.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Name | ast.Attribute)
    ]


def leaky_comparisons(source: str) -> list[str]:
    """Comparisons in `source` that may compare a credential byte by byte."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        if not any(isinstance(op, TIMING_LEAKS) for op in node.ops):
            continue
        operands = [node.left, *node.comparators]
        if any(SECRET_NAME.search(name) for operand in operands for name in _identifiers(operand)):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_a_plain_comparison():
    """The guard can fail: these are exactly what it must catch."""
    assert leaky_comparisons("ok = given == consumer.token") == ["line 1: given == consumer.token"]
    assert leaky_comparisons("ok = hash_token(x) != row.token_hash")
    assert leaky_comparisons("ok = given in settings.BROKER_ADMIN_TOKENS")
    assert leaky_comparisons("ok = signature == expected_signature")
    assert not leaky_comparisons("ok = item.token is not None")
    assert not leaky_comparisons("ok = hmac.compare_digest(a.token, b)")


def test_no_credential_is_compared_with_eq_or_in():
    leaks = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            found = leaky_comparisons(path.read_text())
            if found:
                leaks[str(path.relative_to(ROOT))] = found
    assert leaks == {}


# --- every check goes through hmac.compare_digest -----------------------------------------------


@pytest.fixture
def compare_calls(monkeypatch):
    """Counts calls of hmac.compare_digest (still the real function)."""
    calls: list[int] = []
    real = hmac.compare_digest

    def counting(a, b):
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    return calls


def test_the_token_helpers_compare_digests(compare_calls):
    assert token_matches("t", hash_token("t"))
    assert not token_matches("u", hash_token("t"))
    assert secrets_equal("s", "s")
    assert not secrets_equal("x", "s")
    assert StoredToken(hash_token("t")).check_token("t")
    assert len(compare_calls) == 5


def test_empty_credentials_never_match(compare_calls):
    assert not token_matches("", hash_token(""))
    assert not token_matches(None, hash_token("t"))
    assert not secrets_equal("", "")
    assert not token_matches("t", "")


@pytest.mark.django_db
def test_model_token_checks_compare_digests(compare_calls):
    channel = make_channel(token="channel-token")
    consumer = make_consumer_with_token(channel, token="consumer-token")

    assert Channel.objects.get().check_token("channel-token")
    assert not Consumer.objects.get(pk=consumer.pk).check_token("consumer-tokem")
    assert len(compare_calls) == 2


@pytest.mark.django_db
def test_admin_tokens_are_all_compared_whichever_matches(settings, compare_calls):
    """No early exit: the time taken does not say which configured token matched."""
    settings.BROKER_ADMIN_TOKENS = ["first", "second", "third"]
    for given in ["first", "third", "nothing"]:
        compare_calls.clear()
        admin_token_name(given)
        assert len(compare_calls) == 3, given


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "body", "headers"),
    [
        (
            "POST",
            "/channel/orders/broadcast",
            b"x",
            {
                "X-Broker-Channel-Token": "channel-tokem",
                "X-Broker-Producer-ID": "shop",
                "X-Broker-Producer-Token": "producer-token",
            },
        ),
        (
            "POST",
            "/channel/orders/broadcast",
            b"x",
            {
                "X-Broker-Channel-Token": "channel-token",
                "X-Broker-Producer-ID": "shop",
                "X-Broker-Producer-Token": "producer-tokem",
            },
        ),
        (
            "GET",
            "/channel/orders/consumer/worker/queued-jobs",
            b"",
            {
                "X-Broker-Channel-Token": "channel-token",
                "X-Broker-Consumer-Token": "consumer-tokem",
            },
        ),
        ("GET", "/producers", b"", {"Authorization": "Bearer admin-tokem"}),
    ],
    ids=["channel token", "producer token", "consumer token", "admin token"],
)
def test_each_credential_on_the_wire_is_compared_in_constant_time(
    client, settings, compare_calls, method, path, body, headers
):
    settings.BROKER_ADMIN_TOKENS = ["admin-token"]
    channel = make_channel(token="channel-token")
    make_producer(token="producer-token")
    make_consumer_with_token(channel, token="consumer-token")
    compare_calls.clear()

    response = client.generic(method, path, body, content_type="text/plain", headers=headers)

    assert response.status_code in (401, 403)
    assert compare_calls


@pytest.mark.django_db
def test_the_dlq_requeue_form_token_is_compared_in_constant_time(client, compare_calls):
    channel = make_channel(token="channel-token")
    make_consumer_with_token(channel, token="consumer-token")
    compare_calls.clear()

    response = client.post(
        "/channel/orders/consumer/worker/dlq", "requeue=consumer-tokem", content_type=FORM
    )

    assert response.status_code in (400, 401, 403)
    assert compare_calls
