"""Schema-driven fuzzing of the REST API (docs/reliability.md): no 5xx, and answers that match
/api/schema/.

schemathesis reads the schema the app serves and, for every operation, sends generated requests
(its coverage cases plus valid and invalid random ones) through the WSGI app in process, against
a real test database. Purely random IDs and tokens would stop nearly every request at a 404 or a
401, so `steer` swaps most generated path IDs and token headers for those of the rows built by
`broker_data`; the rest keep their generated value, so the error paths are exercised too.

Checks: no 5xx; every status code documented; content type, headers and body of every response
as the schema says; and every error in the API's one error shape. Bounded for CI
(MAX_EXAMPLES per operation, about 30 s of CPU in all) and deterministic: derandomized
generation, a fixed seed, the same rows and IDs for every operation, and steering by a stable hash.
Select with `pytest -m fuzz`, skip with `-m "not fuzz"`.
"""

from __future__ import annotations

import json
import os
import re
import time
import zlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
import schemathesis
from django.utils import timezone
from hypothesis import HealthCheck, settings
from schemathesis.core import NotSet

from broker.api.conditional import last_modified
from broker.models import Channel, Producer
from broker.publishing import publish
from broker.wsgi import application
from consumers.models import Consumer
from jobs.api import long_poll
from jobs.models import Job
from jobs.queue import take_for_pull
from tests.conftest import ADMIN_TOKEN
from tests.db_snapshot import fingerprint

pytestmark = [
    pytest.mark.fuzz,
    # Every operation starts from the same rows with the same IDs (sequences reset).
    pytest.mark.django_db(transaction=True, reset_sequences=True),
]

# Examples per operation and phase: 25 in the README's test command, 50 in CI's second run of
# the suite (.ci/run), FUZZ_MAX_EXAMPLES=500 for a deeper run by hand.
MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES", "25"))
CHANNEL_TOKEN = "channel-token"
PRODUCER_TOKEN = "producer-token"
CONSUMER_TOKEN = "consumer-token"  # both consumers'
MESSAGE_IDS = ["m-1", "m-2", "m-3", "m-4"]
SCHEDULED_ID = "later-1"  # a scheduled message, never released (no dispatcher runs)
CALLBACK_URL = "http://127.0.0.1:9/hook"  # nothing is delivered: no dispatcher runs

# Existing IDs a generated path parameter is steered to.
KNOWN_PATH_VALUES: dict[str, list[str]] = {
    "channel_id": ["orders"],
    "resource_id": ["orders", "shop"],
    "consumer_id": ["billing", "puller"],
    "message_id": [*MESSAGE_IDS, SCHEDULED_ID],
    "job_id": [str(pk) for pk in range(1, 2 * len(MESSAGE_IDS) + 1)],
}
# Values the generator rarely or never produces for a path segment; each must give a 4xx.
ODD_PATH_VALUES = ["\x00", "a\x00b", "x" * 256, "\u00fc", " ", "-1", "9" * 19, "0" * 18 + "1"]
BATCH_DETAILS = {"errors", "duplicates"}
RESOURCE_ID = re.compile(r"[A-Za-z0-9_-]{1,255}\Z")
VALID_HEADERS: dict[str, str] = {
    "Authorization": f"Bearer {ADMIN_TOKEN}",
    "X-Broker-Channel-Token": CHANNEL_TOKEN,
    "X-Broker-Producer-ID": "shop",
    "X-Broker-Producer-Token": PRODUCER_TOKEN,
    "X-Broker-Consumer-Token": CONSUMER_TOKEN,
}

schema = schemathesis.openapi.from_wsgi(
    "/api/schema/",
    application,
    config=schemathesis.Config.from_dict(
        {
            "seed": 20260101,
            "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "deterministic": True},
            # Inputs must not depend on what else the process imported (schemathesis harvests
            # string constants from loaded modules) nor on values in earlier responses (random
            # tokens, timestamps): the same requests in every run, alone or in the whole suite.
            "analysis": {"constants": {"enabled": False}},
            "phases": {
                "coverage": {"extra-data-sources": {"responses": False}},
                "fuzzing": {
                    "extra-data-sources": {"responses": False},
                    "error-feedback": {"enabled": False},
                },
            },
            "checks": {
                "enabled": False,
                "not_a_server_error": {"enabled": True},
                "response_schema_conformance": {"enabled": True},
                "content_type_conformance": {"enabled": True},
                "response_headers_conformance": {"enabled": True},
                "status_code_conformance": {"enabled": True},
            },
        }
    ),
)


def _pick(seed: str, generated: Any, known: list[str], odd: Sequence[str] = ()) -> Any:
    """Mostly one of `known`; else `generated` or one of `odd`, by a stable hash of `seed`.

    crc32, not `hash()`: string hashes change from one process to the next.
    """
    slot = zlib.crc32(seed.encode())
    kind, index = slot % 8, slot // 8
    if kind == 0:
        return generated
    if kind == 1 and odd:
        return odd[index % len(odd)]
    return known[index % len(known)]


def steer(case: schemathesis.Case[Any]) -> None:
    """Point most generated IDs, tokens and URLs at the fixture's rows; the rest stay generated.

    The choice hashes the whole generated request, so schemathesis's coverage cases (which reuse
    the same few values) are steered differently from one another too.
    """
    seed = _fingerprint(case)
    for name, value in (case.path_parameters or {}).items():
        if name in KNOWN_PATH_VALUES:
            case.path_parameters[name] = _pick(
                seed + name, value, KNOWN_PATH_VALUES[name], ODD_PATH_VALUES
            )
    case.headers.setdefault("Authorization", VALID_HEADERS["Authorization"])
    for name, valid in VALID_HEADERS.items():
        if name in case.headers:  # a missing header stays missing
            case.headers[name] = _pick(seed + name, case.headers[name], [valid])
    if isinstance(case.body, dict) and "callbackUrl" in case.body:
        case.body["callbackUrl"] = _pick(seed, case.body["callbackUrl"], [CALLBACK_URL])
    if case.method in ("PUT", "DELETE") and "If-Unmodified-Since" not in case.headers:
        # Changing an existing resource needs its Last-Modified, a header the schema does not
        # declare, so schemathesis never sends it.
        changed_at = _changed_at(case.operation.path, case.path_parameters or {})
        if changed_at is not None:
            case.headers["If-Unmodified-Since"] = _pick(
                seed, "Thu, 01 Jan 2026 00:00:00 GMT", [last_modified(changed_at)]
            )


def _fingerprint(case: schemathesis.Case[Any]) -> str:
    """The generated request as text that is the same in every run (no object addresses)."""
    headers = sorted(
        (name.lower(), value)
        for name, value in case.headers.items()
        if not name.lower().startswith("x-schemathesis")
    )
    body = None if isinstance(case.body, NotSet) else case.body
    return repr((case.method, case.path_parameters, headers, case.query, body))


def _changed_at(template: str, path: dict[str, Any]) -> datetime | None:
    """When the resource a PUT or DELETE path names last changed, if it exists."""
    if not all(RESOURCE_ID.match(str(value)) for value in path.values()):
        return None  # no such row can exist (and NUL cannot even be queried)
    resource: Channel | Producer | Consumer | None
    if "consumer_id" in path:
        resource = Consumer.objects.filter(
            channel_id=path["channel_id"], public_id=path["consumer_id"]
        ).first()
    elif "resource_id" in path:
        model = Producer if template.startswith("/producer/") else Channel
        resource = model.objects.filter(pk=path["resource_id"]).first()
    else:
        return None
    return resource.changed_at if resource else None


def error_shape(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case[Any]
) -> bool | None:
    """Every 4xx/5xx is JSON `{"Error": "<message>"}` (broker/api/errors.py), documented or not;
    the batch broadcast's refusals may add what they refuse (its `errors`, `duplicates`)."""
    if response.status_code < 400:
        return None
    assert response.headers.get("content-type", [""])[0].startswith("application/json"), (
        f"{response.status_code} is not JSON: {response.headers.get('content-type')}"
    )
    body = json.loads(response.content)
    assert isinstance(body, dict), body
    details = BATCH_DETAILS if case.operation.path.endswith("/broadcast-batch") else set()
    assert "Error" in body, body
    assert set(body) - {"Error"} <= details, body
    assert isinstance(body["Error"], str), body
    return True


@pytest.fixture
def broker_data(settings: Any) -> None:
    """A channel with a push and a pull consumer, four messages, jobs in every state, and a
    scheduled message."""
    settings.BROKER_ADMIN_TOKENS = [ADMIN_TOKEN]
    channel = Channel(id="orders", name="Orders")
    channel.set_token(CHANNEL_TOKEN)
    channel.save()
    producer = Producer(id="shop", name="Shop")
    producer.set_token(PRODUCER_TOKEN)
    producer.save()
    for public_id, kind in [("billing", Consumer.Type.PUSH), ("puller", Consumer.Type.PULL)]:
        consumer = Consumer(
            channel=channel,
            public_id=public_id,
            name=public_id.title(),
            callback_url=f"http://127.0.0.1:9/{public_id}",
            type=kind,
        )
        consumer.set_token(CONSUMER_TOKEN)
        consumer.save()
    for priority, message_id in enumerate(MESSAGE_IDS):
        publish(
            channel, {"n": priority}, producer=producer, message_id=message_id, priority=priority
        )
    publish(
        channel,
        b"later",
        producer=producer,
        message_id=SCHEDULED_ID,
        scheduled_for=timezone.now() + timedelta(days=1),
    )
    assert list(Job.objects.order_by("pk").values_list("pk", flat=True)) == [
        int(pk) for pk in KNOWN_PATH_VALUES["job_id"]
    ]
    for consumer_id in ["billing", "puller"]:
        take_for_pull(_job(consumer_id, "m-2"))
        _job(consumer_id, "m-2").mark_dead("failed in the fuzz fixture")
    take_for_pull(_job("puller", "m-3"))
    take_for_pull(_job("puller", "m-4"))
    _job("puller", "m-4").mark_delivered()


class ClockWhoseSleepsPassAtOnce:
    """long_poll's `time` here: a generated claim `wait` (up to 20 s) costs the run nothing, and
    the waiting claim still polls (a claim each POLL_INTERVAL_SECONDS of its wait)."""

    def __init__(self) -> None:
        self.slept = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.slept

    def sleep(self, seconds: float) -> None:
        self.slept += seconds


@pytest.fixture(autouse=True)
def waits_pass_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(long_poll, "time", ClockWhoseSleepsPassAtOnce())


def _job(consumer_id: str, message_id: str) -> Job:
    return Job.objects.get(consumer__public_id=consumer_id, message__public_id=message_id)


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api_answers_without_server_errors_and_as_documented(
    case: schemathesis.Case[Any], broker_data: None
) -> None:
    steer(case)
    before = fingerprint()
    response = case.call()
    case.validate_response(response, additional_checks=[error_shape])
    if response.status_code >= 400:
        # A refused request changes nothing (issue 9): not a row, not a timestamp.
        assert fingerprint() == before, (
            f"{case.method} {case.formatted_path} -> {response.status_code}"
        )


def test_the_fingerprint_sees_every_change(broker_data: None) -> None:
    """The no-change check above can fail: any write moves the fingerprint."""
    before = fingerprint()
    Producer.objects.filter(pk="shop").update(name="Shop!")
    assert fingerprint() != before
    after_rename = fingerprint()
    Job.objects.filter(pk=1).update(attempts=7)
    assert fingerprint() != after_rename
