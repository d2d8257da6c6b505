"""Tokens and secrets never appear in logs or responses, except the response that sets them
(docs/api.md; docs/reliability.md; issue 9).

One representative session: create a channel, a producer and two consumers with tokens and an
imported signing secret, broadcast, pull, fail authentication in every way, use and revoke an API
key, deliver signed webhooks, rotate the signing secret and deliver again, and let a real
`manage.py dispatch` process deliver too (the `seen` fixture). Every logger runs at DEBUG (SQL
with its parameters included) and so does the dispatcher process; then every secret value is
looked for, a test for each, in the captured logs, in the process's output and in every response
(bodies and headers). Issue 16 added the delivery and access lines, checked as rendered in both
BROKER_LOG_FORMATs (text and json).
"""

from __future__ import annotations

import io
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection

from broker import publish
from consumers.models import Consumer
from jobs.delivery import AttemptResult
from jobs.dispatch import Dispatcher, DispatcherConfig
from jobs.models import Job
from jobs.states import DELIVERED
from tests.conftest import FORM
from tests.delivery import run_once
from tests.processes import kill_if_running, start_dispatcher, stop, wait_until
from tests.receiver import Reply

pytestmark = pytest.mark.django_db(transaction=True)


def new_secret(kind: str) -> str:
    return f"{kind}-{secrets.token_urlsafe(24)}"


def signing_secret() -> str:
    import base64

    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass
class Session:
    """The API client of the test, keeping every response it got."""

    client: Any
    admin: dict[str, str]
    responses: list[tuple[str, str]] = field(default_factory=list)  # (label, everything sent back)

    def call(self, method: str, path: str, body: str | bytes = b"", **options) -> Any:
        headers = {**options.pop("headers", {})}
        if options.pop("as_admin", True):
            headers = {**self.admin, **headers}
        response = self.client.generic(
            method,
            path,
            body,
            content_type=options.pop("content_type", FORM),
            headers=headers,
        )
        label = f"{method} {path} -> {response.status_code}"
        everything = (
            response.content.decode("utf-8", "replace")
            + "\n"
            + "\n".join(f"{name}: {value}" for name, value in response.items())
        )
        self.responses.append((label, everything))
        return response


@pytest.fixture
def all_logs(caplog):
    """Every logger at DEBUG, SQL statements with their parameters too."""
    loggers = [logging.getLogger(), *map(logging.getLogger, list(logging.root.manager.loggerDict))]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
    caplog.set_level(logging.DEBUG)
    connection.force_debug_cursor = True
    yield caplog
    connection.force_debug_cursor = False
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


def deliver_due() -> list[AttemptResult]:
    return run_once(Dispatcher(DispatcherConfig(dispatcher_id="secrets-test")), limit=50)


def admin_api(client, settings, admin_token: str) -> Session:
    """The test's API client, an admin by `admin_token` (the only one)."""
    settings.BROKER_ADMIN_TOKENS = [admin_token]
    return Session(client, {"Authorization": f"Bearer {admin_token}"})


def dispatcher_output_until(condition, **environment: str) -> str:
    """The output of a real `manage.py dispatch` process run until `condition()` holds (30 s at
    most), then stopped with SIGTERM."""
    process = start_dispatcher(**environment)
    try:
        wait_until(condition, seconds=30)
        return stop(process)
    finally:
        kill_if_running(process)


def leaks(values: dict[str, str], places: list[tuple[str, str]]) -> list[str]:
    """A line "<secret> in <place>" for each secret of `values` (name -> value) found in the text
    of one of `places` ((place, text) pairs): as it is, URL-encoded, or a signing key's base64."""
    found: list[str] = []
    for name, value in values.items():
        needles = [value, quote(value, safe="")]
        if value.startswith("whsec_"):
            needles.append(value.removeprefix("whsec_"))
        for needle in needles:
            found.extend(f"{name} in {where}" for where, text in places if needle in text)
    return found


@dataclass
class Seen:
    """What the representative session used and produced: the checks below look through it."""

    values: dict[str, str]  # secret name -> value
    allowed: dict[str, set[str]]  # secret name -> labels of the responses that may show it
    responses: list[tuple[str, str]]  # (label, everything sent back), in order
    logs: str  # every record captured in the test process, at DEBUG with SQL
    debug_records: int  # how many of them are at DEBUG
    dispatcher_output: str  # a real dispatcher process's, at DEBUG


@pytest.fixture
def seen(client, settings, receiver, all_logs) -> Seen:
    """The module's representative session, run through the API, the commands, in-process
    dispatcher steps and a real dispatcher process."""
    values = {
        "admin token": new_secret("admin"),
        "channel token": new_secret("channel"),
        "producer token": new_secret("producer"),
        "push consumer token": new_secret("push"),
        "pull consumer token": new_secret("pull"),
        "imported signing secret": signing_secret(),
        "wrong channel token": new_secret("wrong-channel"),
        "wrong producer token": new_secret("wrong-producer"),
        "wrong consumer token": new_secret("wrong-consumer"),
        "wrong admin token": new_secret("wrong-admin"),
        "staff password": new_secret("password"),
    }
    api = admin_api(client, settings, values["admin token"])
    allowed: dict[str, set[str]] = {}

    def setting(name: str, method: str, path: str, body: str) -> Any:
        response = api.call(method, path, body)
        allowed.setdefault(name, set()).add(api.responses[-1][0])
        return response

    # Resources, each with its token set (and shown) once.
    setting("channel token", "PUT", "/channel/orders", f"token={values['channel token']}")
    setting("producer token", "PUT", "/producer/shop", f"token={values['producer token']}")
    push = setting(
        "push consumer token",
        "PUT",
        "/channel/orders/consumer/billing",
        f"callbackUrl={quote(receiver.url())}&token={values['push consumer token']}"
        f"&signingSecret={quote(values['imported signing secret'])}",
    )
    assert push.status_code == 200, push.content
    setting(
        "pull consumer token",
        "PUT",
        "/channel/orders/consumer/worker",
        f"callbackUrl={quote(receiver.url())}&type=pull&token={values['pull consumer token']}",
    )

    # Broadcasts, good and refused.
    producer = {
        "X-Broker-Channel-Token": values["channel token"],
        "X-Broker-Producer-ID": "shop",
        "X-Broker-Producer-Token": values["producer token"],
    }
    for number in range(3):
        response = api.call(
            "POST",
            "/channel/orders/broadcast",
            b'{"order": 1}',
            content_type="application/json",
            headers={**producer, "X-Broker-Message-ID": f"m-{number}"},
            as_admin=False,
        )
        assert response.status_code == 201
    for wrong in [
        {"X-Broker-Channel-Token": values["wrong channel token"]},
        {"X-Broker-Producer-Token": values["wrong producer token"]},
    ]:
        refused = api.call(
            "POST",
            "/channel/orders/broadcast",
            b"x",
            headers={**producer, **wrong},
            as_admin=False,
        )
        assert refused.status_code == 403

    # Pull: list, claim, report, fail one, requeue it with the token in the form.
    pull = {
        "X-Broker-Channel-Token": values["channel token"],
        "X-Broker-Consumer-Token": values["pull consumer token"],
    }
    worker = "/channel/orders/consumer/worker"
    assert api.call("GET", f"{worker}/queued-jobs", headers=pull, as_admin=False).status_code == 200
    claimed = api.call("POST", f"{worker}/claim", "limit=2", headers=pull, as_admin=False)
    assert claimed.status_code == 200
    jobs = Job.objects.filter(consumer__public_id="worker", status="INFLIGHT").order_by("pk")
    first, second = list(jobs)[:2]
    for job, state in [(first, "DELIVERED"), (second, "DEAD")]:
        moved = api.call(
            "POST",
            f"{worker}/job/{job.public_id}",
            f'{{"NextState": "{state}"}}',
            content_type="application/json",
            headers=pull,
            as_admin=False,
        )
        assert moved.status_code == 202
    requeued = api.call(
        "POST", f"{worker}/dlq", f"requeue={values['pull consumer token']}", as_admin=False
    )
    assert requeued.status_code == 202, requeued.content
    wrong_pull = {**pull, "X-Broker-Consumer-Token": values["wrong consumer token"]}
    assert (
        api.call("GET", f"{worker}/queued-jobs", headers=wrong_pull, as_admin=False).status_code
        == 403
    )
    bad_admin = {"Authorization": f"Bearer {values['wrong admin token']}"}
    assert api.call("GET", "/producers", headers=bad_admin, as_admin=False).status_code == 401

    # An API key: printed once by the command, then used, revoked, refused.
    out = io.StringIO()
    call_command("create_api_key", "deploy-bot", stdout=out)
    values["api key"] = out.getvalue().strip()
    with_key = {"Authorization": f"Bearer {values['api key']}"}
    assert api.call("GET", "/channels", headers=with_key, as_admin=False).status_code == 200
    call_command("revoke_api_key", "deploy-bot", stdout=io.StringIO())
    assert api.call("GET", "/channels", headers=with_key, as_admin=False).status_code == 401

    # Signed push deliveries, a secret rotation (the new secret is shown by the POST), and more.
    assert [result.succeeded for result in deliver_due()] == [True] * 3
    secret_path = "/channel/orders/consumer/billing/secret"
    shown = api.call("GET", secret_path)  # the secret's own read endpoint (admin only)
    allowed.setdefault("imported signing secret", set()).add(api.responses[-1][0])
    assert shown.json()["SigningSecret"] == values["imported signing secret"]
    rotated = api.call("POST", secret_path)
    values["rotated signing secret"] = rotated.json()["SigningSecret"]
    allowed["rotated signing secret"] = {api.responses[-1][0]}
    publish("orders", b"after rotation", producer="shop", message_id="m-rotated")
    assert all(result.succeeded for result in deliver_due())
    assert len(receiver.received[-1].headers["webhook-signature"].split()) == 2  # old and new

    # A failing receiver (its error lands in last_error and a delivery attempt).
    receiver.replies["/hook"] = Reply(500, body=b"boom")
    publish("orders", b"to fail", producer="shop", message_id="m-fails")
    assert not any(result.succeeded for result in deliver_due())

    # Every read the operators have: JSON, health, metrics, the admin's HTML.
    User.objects.create_superuser("ops", password=values["staff password"])
    for path in [
        "/channels",
        "/channel/orders",
        "/producers",
        "/producer/shop",
        "/channel/orders/consumers",
        "/channel/orders/consumer/billing",
        "/channel/orders/consumer/worker",
        "/channel/orders/messages",
        "/channel/orders/message/m-0",
        "/channel/orders/consumer/billing/dlq",
        "/dlq-status",
        "/job-status",
        "/_status",
        "/metrics",
    ]:
        assert api.call("GET", path).status_code == 200, path
    client.login(username="ops", password=values["staff password"])
    for path in [
        # The consumer's admin page is left out: it shows the signing secrets (see below).
        "/admin/consumers/consumer/",
        "/admin/broker/channel/orders/change/",
        "/admin/broker/producer/shop/change/",
        "/admin/jobs/deliveryattempt/",
    ]:
        assert api.call("GET", path, as_admin=False).status_code == 200, path

    # A real dispatcher process at DEBUG, with Django's debug mode (SQL logged) on.
    receiver.replies["/hook"] = Reply(200)
    publish("orders", b"by the process", producer="shop", message_id="m-process")
    dispatcher_output = dispatcher_output_until(
        lambda: Job.objects.filter(
            message__public_id="m-process", consumer__public_id="billing", status=DELIVERED
        ).exists(),
        DJANGO_LOG_LEVEL="DEBUG",
        DJANGO_DEBUG="true",
    )

    # caplog keeps the records of each phase of a test apart: this fixture's are kept here.
    return Seen(
        values,
        allowed,
        api.responses,
        all_logs.text,
        sum(record.levelno == logging.DEBUG for record in all_logs.records),
        dispatcher_output,
    )


def test_no_secret_in_the_logs_at_debug(seen):
    # The logs were really captured at DEBUG, SQL included (so this test can fail).
    assert "SELECT" in seen.logs
    assert seen.debug_records > 0

    found = leaks(seen.values, [("the logs", seen.logs)])
    assert found == [], "\n".join(found)


def test_no_secret_in_the_output_of_a_dispatcher_process_at_debug(seen):
    assert "DEBUG" in seen.dispatcher_output  # it did log at DEBUG

    found = leaks(seen.values, [("the dispatcher's output", seen.dispatcher_output)])
    assert found == [], "\n".join(found)


def test_no_secret_in_a_response_but_the_ones_that_set_or_show_it(seen):
    found: list[str] = []
    for name, value in seen.values.items():
        others = [
            (f"the response of {label}", text)
            for label, text in seen.responses
            if label not in seen.allowed.get(name, set())
        ]
        found.extend(leaks({name: value}, others))
    assert found == [], "\n".join(found)
    # Each secret was shown where it was set (the check above is not vacuous).
    for name, labels in seen.allowed.items():
        for label in labels:
            text = dict(seen.responses)[label]
            assert seen.values[name] in text or name == "imported signing secret", (name, label)


def test_the_admin_consumer_page_does_not_show_signing_secrets(client):
    from tests.helpers import make_channel, make_consumer

    consumer = make_consumer(make_channel())
    secret = consumer.rotate_signing_secret(consumer.changed_at)
    User.objects.create_superuser("ops", password="ops-password")
    client.login(username="ops", password="ops-password")

    page = client.get(f"/admin/consumers/consumer/{consumer.pk}/change/")

    assert page.status_code == 200
    text = page.content.decode()
    assert secret not in text
    assert consumer.previous_signing_secret not in text


@pytest.fixture
def traced():
    """Tracing on (issue 16), spans kept in memory: their attributes must not carry secrets
    either, as an exporter would send them on."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from broker import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.use(None)
    provider.shutdown()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_delivery_and_access_lines_carry_no_secret_in_either_format(
    client, settings, receiver, all_logs, traced, log_format
):
    """Issue 16's lines: a line per delivery outcome (delivered, retried, dead, unanswered) to a
    consumer with a token, a signing secret and a callback URL with a password and a token in
    its query, a producer's secret kept as a metadata header; a line per request, with tokens
    in headers and query strings. Every captured record is rendered in `log_format` as the
    broker writes it, and a dispatcher process runs with BROKER_LOG_FORMAT=`log_format`."""
    from broker.logs import TEXT_FORMAT, json_formatter

    values = {
        "admin token": new_secret("admin"),
        "channel token": new_secret("channel"),
        "producer token": new_secret("producer"),
        "consumer token": new_secret("consumer"),
        "signing secret": signing_secret(),
        "callback password": new_secret("password"),
        "callback query token": new_secret("query"),
        "kept metadata secret": new_secret("metadata"),
        "query token": new_secret("in-query"),
        "wrong admin token": new_secret("wrong-admin"),
    }
    api = admin_api(client, settings, values["admin token"])
    query = f"?token={values['query token']}&api_key={values['query token']}"
    assert api.call("PUT", f"/channel/orders{query}", f"token={values['channel token']}")
    assert api.call("PUT", "/producer/shop", f"token={values['producer token']}")
    callback = (
        f"http://hook:{values['callback password']}@127.0.0.1:{receiver.port}/hook"
        f"?token={values['callback query token']}"
    )
    created = api.call(
        "PUT",
        f"/channel/orders/consumer/billing{query}",
        f"callbackUrl={quote(callback, safe='')}&token={values['consumer token']}"
        f"&signingSecret={quote(values['signing secret'])}",
    )
    assert created.status_code == 200, created.content

    producer = {
        "X-Broker-Channel-Token": values["channel token"],
        "X-Broker-Producer-ID": "shop",
        "X-Broker-Producer-Token": values["producer token"],
        "X-Broker-Metadata-Headers": "X-Api-Key",
        "X-Api-Key": values["kept metadata secret"],
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }
    replies = [Reply(200), Reply(503), Reply(410)]
    for number, reply in enumerate(replies):
        receiver.replies["/hook"] = reply
        sent = api.call(
            "POST",
            f"/channel/orders/broadcast{query}",
            b'{"order": 1}',
            content_type="application/json",
            headers={**producer, "X-Broker-Message-ID": f"m-{number}"},
            as_admin=False,
        )
        assert sent.status_code == 201
        deliver_due()
    assert receiver.received[-1].headers["X-Api-Key"] == values["kept metadata secret"]
    assert receiver.received[-1].headers["Authorization"].startswith("Basic ")  # userinfo
    wrong = {"Authorization": f"Bearer {values['wrong admin token']}"}
    assert api.call("GET", f"/channels{query}", headers=wrong, as_admin=False).status_code == 401
    assert api.call("GET", f"/channels{query}").status_code == 200

    # Unanswered: the same URL's secrets, on a port that refuses (its error lands in the line).
    Consumer.objects.filter(public_id="billing").update(
        callback_url=callback.replace(f":{receiver.port}/", ":9/"), paused=False
    )
    publish("orders", b"unanswered", producer="shop", message_id="m-refused")
    [unanswered] = deliver_due()
    assert unanswered.error_class == "connection"

    # A dispatcher process writing this format.
    receiver.replies["/hook"] = Reply(200)
    Consumer.objects.filter(public_id="billing").update(callback_url=callback)
    publish("orders", b"by the process", producer="shop", message_id="m-process")
    dispatcher_output = dispatcher_output_until(
        lambda: Job.objects.filter(message__public_id="m-process", status=DELIVERED).exists(),
        BROKER_LOG_FORMAT=log_format,
        DJANGO_LOG_LEVEL="DEBUG",
        DJANGO_DEBUG="true",
    )

    # The test's receiver stands for the consumer's own server: its access log (aiohttp's) is
    # the consumer's business, and shows the query it was called with.
    records = [record for record in all_logs.records if record.name != "aiohttp.access"]
    formatter = json_formatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    rendered = "\n".join(formatter.format(record) for record in records)
    # Stored as given, in plain text: the callback URL (shown to admins), and a metadata header,
    # which is the producer's data as its payload is. SQL statement logging at DEBUG shows them
    # as it shows every value written, so for them the statements are left out.
    stored_plain = {"callback password", "callback query token", "kept metadata secret"}
    rendered_without_sql = "\n".join(
        formatter.format(record) for record in records if record.name != "django.db.backends"
    )
    outcomes = [r for r in records if r.name == "broker.deliveries"]
    assert {r.outcome for r in outcomes} == {"delivered", "retry", "dead"}
    assert any(r.levelno == logging.WARNING for r in outcomes)
    assert any(r.name == "broker.access" and r.status == 401 for r in records)
    assert '"logger": "broker.deliveries"' in dispatcher_output or log_format == "text"
    assert "broker.deliveries" in dispatcher_output
    spans = repr([(s.name, s.attributes, s.status, s.events) for s in traced.get_finished_spans()])
    assert "deliver orders" in spans

    found: list[str] = []
    for name, value in values.items():
        logs = rendered_without_sql if name in stored_plain else rendered
        places = [
            ("the logs", logs),
            ("the dispatcher's output", dispatcher_output),
            ("the spans", spans),
        ]
        found.extend(leaks({name: value}, places))
    assert found == [], "\n".join(found)
