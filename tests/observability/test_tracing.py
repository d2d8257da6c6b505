"""Tracing (issue 16): the W3C trace context a message keeps and its deliveries send, and the
OpenTelemetry spans of a broadcast and of each push attempt (docs/observability.md).

Spans are checked in-process with the SDK's InMemorySpanExporter: the broadcast view through
Django's test client, and dispatcher steps delivering to a real receiver on loopback.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from broker import publish, tracing
from broker.models import Message
from broker.publishing import is_refused_metadata_header
from jobs.models import Job
from tests import ROOT
from tests.delivery import push_consumer, run_once
from tests.helpers import BROADCAST_HEADERS, make_consumer
from tests.processes import NEVER_CONNECTED
from tests.receiver import Reply

pytestmark = pytest.mark.django_db

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
PRODUCER_PARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
PRODUCER_STATE = "vendor=opaque,other@tenant=x"


@pytest.fixture(autouse=True)
def quick_retries(settings):
    settings.BROKER_RETRY_JITTER = 0
    settings.BROKER_RETRY_DELAYS = [0, 0]
    settings.BROKER_DELIVERY_TIMEOUT_SECONDS = 2


@pytest.fixture
def provider():
    """Tracing on for the test, spans kept in memory (`provider.exporter`)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.exporter = exporter  # type: ignore[attr-defined]
    tracing.use(provider)
    yield provider
    tracing.use(None)
    provider.shutdown()


@pytest.fixture
def spans(provider):
    return provider.exporter


def broadcast(client, body=b'{"order": 1}', **headers):
    return client.post(
        "/channel/orders/broadcast",
        body,
        content_type="application/json",
        headers={**BROADCAST_HEADERS, **headers},
    )


def hex_id(number: int, digits: int) -> str:
    return f"{number:0{digits}x}"


# --- the W3C trace context ---------------------------------------------------------------------


def test_a_valid_traceparent_is_kept_with_its_tracestate():
    context = tracing.parse(PRODUCER_PARENT, PRODUCER_STATE)

    assert context == tracing.TraceContext(PRODUCER_PARENT, PRODUCER_STATE)
    assert context.trace_id == TRACE_ID
    assert context.headers() == {"traceparent": PRODUCER_PARENT, "tracestate": PRODUCER_STATE}


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        PRODUCER_PARENT.upper(),  # hex is lower case
        f"00-{'0' * 32}-{PARENT_ID}-01",  # all-zero trace ID
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero parent ID
        f"ff-{TRACE_ID}-{PARENT_ID}-01",  # a version that is never valid
        f"{PRODUCER_PARENT}-extra",  # version 00 has exactly four fields
        f"01-{TRACE_ID}-{PARENT_ID}-01extra",  # a later version: a dash after the fourth
        f"00-{TRACE_ID}-{PARENT_ID}-1",
        f"00-{TRACE_ID}\n-{PARENT_ID}-01",
        f"00_{TRACE_ID}_{PARENT_ID}_01",
    ],
)
def test_a_malformed_traceparent_is_ignored(value):
    assert tracing.parse(value, PRODUCER_STATE) is None


def test_a_later_version_is_read_as_version_00():
    context = tracing.parse(f"cc-{TRACE_ID}-{PARENT_ID}-01-what-comes-later")

    assert context == tracing.TraceContext(PRODUCER_PARENT)


@pytest.mark.parametrize(
    "state",
    [
        "Upper=case",  # keys are lower case
        "k=v,k=w",  # a key twice
        "novalue=",
        "k=v=w",
        ",".join(f"k{n}=v" for n in range(33)),  # over 32 members
        "k=" + "v" * 600,  # over 512 characters (and a value over 256)
        "k=v\n",
    ],
)
def test_a_malformed_tracestate_is_dropped_and_the_traceparent_kept(state):
    assert tracing.parse(PRODUCER_PARENT, state) == tracing.TraceContext(PRODUCER_PARENT)


def test_tracestate_members_are_read_as_a_list():
    context = tracing.parse(PRODUCER_PARENT, " a=1 ,, b@c=2\t")

    assert context == tracing.TraceContext(PRODUCER_PARENT, "a=1,b@c=2")


def test_the_broker_s_trace_headers_are_not_refused_as_metadata():
    """A producer may still name them in X-Broker-Metadata-Headers (as before); the broker's own
    trace context replaces them on delivery (below)."""
    assert not is_refused_metadata_header("traceparent")
    assert not is_refused_metadata_header("tracestate")


# --- tracing off: the producer's context is kept and forwarded -----------------------------------


def test_off_the_producer_s_context_is_kept_and_sent_on_unchanged(
    client, channel, receiver, dispatcher
):
    assert not tracing.enabled()
    push_consumer(channel, receiver)

    response = broadcast(client, traceparent=PRODUCER_PARENT, tracestate=PRODUCER_STATE)

    assert response.status_code == 201
    message = Message.objects.get()
    assert (message.traceparent, message.tracestate) == (PRODUCER_PARENT, PRODUCER_STATE)
    run_once(dispatcher)
    [request] = receiver.received
    assert request.headers["traceparent"] == PRODUCER_PARENT
    assert request.headers["tracestate"] == PRODUCER_STATE


@pytest.mark.parametrize("value", ["00-nonsense", "x" * 10_000, f"{PRODUCER_PARENT}\t-x"])
def test_a_malformed_traceparent_is_never_an_error(client, channel, receiver, dispatcher, value):
    push_consumer(channel, receiver)

    response = broadcast(client, traceparent=value, tracestate=PRODUCER_STATE)

    assert response.status_code == 201
    assert Message.objects.get().traceparent is None
    run_once(dispatcher)
    assert "traceparent" not in receiver.received[0].headers
    assert "tracestate" not in receiver.received[0].headers


def test_without_a_context_nothing_is_sent(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    publish(channel, b"x", producer="shop")

    run_once(dispatcher)

    assert "traceparent" not in receiver.received[0].headers
    assert Message.objects.get().traceparent is None


def test_the_kept_context_replaces_metadata_of_the_same_name(client, channel, receiver, dispatcher):
    push_consumer(channel, receiver)

    broadcast(
        client,
        traceparent=PRODUCER_PARENT,
        **{"X-Broker-Metadata-Headers": "traceparent,X-Tenant", "X-Tenant": "acme"},
    )
    run_once(dispatcher)

    headers = receiver.received[0].headers
    assert headers["traceparent"] == PRODUCER_PARENT
    assert headers["X-Broker-Metadata-Headers"] == "X-Tenant"


def test_publish_takes_a_context_from_its_caller(channel, receiver, dispatcher):
    push_consumer(channel, receiver)

    publish(channel, b"x", producer="shop", traceparent=PRODUCER_PARENT, tracestate="a=1")
    run_once(dispatcher)

    assert receiver.received[0].headers["traceparent"] == PRODUCER_PARENT
    assert receiver.received[0].headers["tracestate"] == "a=1"


# --- tracing on: spans, parents and the header the consumer gets ---------------------------------


def test_a_broadcast_s_span_continues_the_producer_s_trace(client, channel, spans):
    response = broadcast(client, traceparent=PRODUCER_PARENT, tracestate=PRODUCER_STATE)

    assert response.status_code == 201
    [span] = spans.get_finished_spans()
    assert span.name == "publish orders"
    assert span.kind is SpanKind.PRODUCER
    assert hex_id(span.context.trace_id, 32) == TRACE_ID
    assert span.parent is not None
    assert span.parent.is_remote
    assert hex_id(span.parent.span_id, 16) == PARENT_ID
    message = Message.objects.get()
    assert dict(span.attributes) == {
        "messaging.operation.type": "send",
        "messaging.destination.name": "orders",
        "messaging.message.id": message.public_id,
        "broker.producer.id": "shop",
    }
    # The message keeps this span's context (and the producer's trace state) for its deliveries.
    assert message.traceparent == f"00-{TRACE_ID}-{hex_id(span.context.span_id, 16)}-01"
    assert message.tracestate == PRODUCER_STATE


def test_each_attempt_s_span_is_a_child_of_the_broadcast_s_and_its_context_is_sent(
    client, channel, receiver, dispatcher, spans
):
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(503)
    broadcast(client, traceparent=PRODUCER_PARENT, tracestate=PRODUCER_STATE)

    run_once(dispatcher)  # 503: retried at once (delays of 0)
    receiver.replies["/hook"] = Reply(200)
    run_once(dispatcher)

    publish_span, first, second = spans.get_finished_spans()
    job = Job.objects.get()
    for number, (span, request) in enumerate(
        zip([first, second], receiver.received, strict=True), start=1
    ):
        assert span.name == "deliver orders"
        assert span.kind is SpanKind.CLIENT
        assert span.context.trace_id == publish_span.context.trace_id
        assert span.parent.span_id == publish_span.context.span_id
        span_id = hex_id(span.context.span_id, 16)
        assert request.headers["traceparent"] == f"00-{TRACE_ID}-{span_id}-01"
        assert request.headers["tracestate"] == PRODUCER_STATE
        assert span.attributes["broker.delivery.attempt"] == number
        assert span.attributes["broker.job.id"] == job.public_id
    assert first.context.span_id != second.context.span_id
    assert dict(first.attributes) == {
        "messaging.operation.type": "process",
        "messaging.destination.name": "orders",
        "messaging.message.id": Message.objects.get().public_id,
        "broker.consumer.id": "billing",
        "broker.job.id": job.public_id,
        "broker.delivery.attempt": 1,
        "http.request.method": "POST",
        "url.scheme": "http",
        "server.address": "127.0.0.1",
        "server.port": receiver.port,
        "http.response.status_code": 503,
        "error.type": "http-status",
    }
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "HTTP 503"
    assert second.attributes["http.response.status_code"] == 200
    assert "error.type" not in second.attributes
    assert second.status.status_code is StatusCode.UNSET


def test_an_attempt_without_an_answer_has_its_error_class(channel, dispatcher, spans):
    consumer = make_consumer(channel)
    # Port 9 (discard) on loopback: refused at once.
    consumer.callback_url = "http://user:secret-password@127.0.0.1:9/hook?token=secret-in-query"
    consumer.save()
    publish(channel, b"x", producer="shop")

    run_once(dispatcher)

    _, attempt = spans.get_finished_spans()
    assert attempt.attributes["error.type"] == "connection"
    assert "http.response.status_code" not in attempt.attributes
    assert attempt.status.status_code is StatusCode.ERROR
    # Where it went, never the URL's userinfo, path or query.
    assert (attempt.attributes["server.address"], attempt.attributes["server.port"]) == (
        "127.0.0.1",
        9,
    )
    described = repr(attempt.attributes) + repr(attempt.status) + repr(attempt.events)
    assert "secret-password" not in described
    assert "secret-in-query" not in described


def test_without_a_producer_context_the_broadcast_starts_the_trace(
    client, channel, receiver, dispatcher, spans
):
    push_consumer(channel, receiver)

    broadcast(client)
    run_once(dispatcher)

    publish_span, attempt = spans.get_finished_spans()
    assert publish_span.parent is None
    assert attempt.parent.span_id == publish_span.context.span_id
    trace_id = hex_id(publish_span.context.trace_id, 32)
    assert receiver.received[0].headers["traceparent"].startswith(f"00-{trace_id}-")


def test_publish_in_a_host_s_span_is_its_child(channel, provider, spans):
    host = provider.get_tracer("host")

    with host.start_as_current_span("checkout") as checkout:
        publish(channel, b"x", producer="shop", traceparent=PRODUCER_PARENT)

    publish_span = next(s for s in spans.get_finished_spans() if s.name == "publish orders")
    assert publish_span.parent.span_id == checkout.get_span_context().span_id


def test_a_refused_publish_s_span_says_why(channel, spans):
    publish(channel, b"x", producer="shop", message_id="once")

    with pytest.raises(Exception, match="already has a message"):
        publish(channel, b"x", producer="shop", message_id="once")

    refused = spans.get_finished_spans()[-1]
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.events[0].name == "exception"


def test_a_message_published_before_tracing_gets_a_root_span_per_attempt(
    channel, receiver, dispatcher, request
):
    push_consumer(channel, receiver)
    publish(channel, b"x", producer="shop")  # tracing off: no context kept
    spans = request.getfixturevalue("spans")  # now on

    run_once(dispatcher)

    [attempt] = spans.get_finished_spans()
    assert attempt.parent is None
    _, trace_id, span_id, _ = receiver.received[0].headers["traceparent"].split("-")
    assert (trace_id, span_id) == (
        hex_id(attempt.context.trace_id, 32),
        hex_id(attempt.context.span_id, 16),
    )


# --- configuration -----------------------------------------------------------------------------


@pytest.fixture
def otel_environment(monkeypatch):
    for name in [
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        *tracing.ENDPOINT_VARIABLES,
        *tracing.PROTOCOL_VARIABLES,
    ]:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("variables", "exporters"),
    [
        ({}, ()),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ("otlp", "console")),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, ()),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, ()),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_TRACES_EXPORTER": "otlp"},
            ("otlp",),
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, ()),
    ],
)
def test_the_otel_variables_turn_tracing_on(otel_environment, variables, exporters):
    for name, value in variables.items():
        otel_environment.setenv(name, value)

    assert tracing.exporter_names() == exporters


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER='jaeger'"),
        ({"OTEL_TRACES_EXPORTER": "none,otlp"}, "OTEL_TRACES_EXPORTER='none,otlp'"),
        ({"OTEL_SDK_DISABLED": "maybe"}, "OTEL_SDK_DISABLED='maybe' is not a boolean"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL='grpc'",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "x"},
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='x'",
        ),
    ],
)
def test_values_the_broker_cannot_honour_stop_start_up(otel_environment, variables, message):
    for name, value in variables.items():
        otel_environment.setenv(name, value)

    with pytest.raises(ImproperlyConfigured, match=message):
        tracing.exporter_names()


def test_tracing_without_the_otel_packages_says_what_to_install(otel_environment):
    otel_environment.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    otel_environment.setattr(importlib.util, "find_spec", lambda name: None)

    with pytest.raises(ImproperlyConfigured, match=r"OTEL_EXPORTER_OTLP_ENDPOINT turns.*\[otel\]"):
        tracing.exporter_names()


def run_python(code: str, **variables: str) -> subprocess.CompletedProcess[str]:
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("OTEL_") and key != "DJANGO_SETTINGS_MODULE"
    }
    environment.update(DATABASE_URL=NEVER_CONNECTED, **variables)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**environment, "DJANGO_SETTINGS_MODULE": "broker.settings"},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_off_nothing_of_opentelemetry_is_imported():
    """Not the SDK, not even the API: tracing off costs no import (and no time at start-up)."""
    result = run_python(
        "import sys, django; django.setup()\n"
        "import broker.publishing, jobs.dispatch, broker.api.broadcast, broker.tracing\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "print(broker.tracing.enabled(), loaded)\n"
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False []"


def test_on_the_process_gets_an_sdk_provider_named_after_the_broker():
    code = (
        "import django; django.setup()\n"
        "from opentelemetry import trace\n"
        "from broker import tracing\n"
        "provider = trace.get_tracer_provider()\n"
        "print(tracing.enabled(), type(provider).__module__, "
        "provider.resource.attributes['service.name'])\n"
    )

    default = run_python(code, OTEL_TRACES_EXPORTER="console")
    named = run_python(code, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="broker-eu")

    assert default.returncode == 0, default.stderr
    assert default.stdout.split() == ["True", "opentelemetry.sdk.trace", "webhook-broker"]
    assert named.stdout.split() == ["True", "opentelemetry.sdk.trace", "broker-eu"]


def test_a_bad_otel_value_stops_the_process_naming_it():
    result = run_python("import django; django.setup()", OTEL_TRACES_EXPORTER="zipkin")

    assert result.returncode != 0
    assert "OTEL_TRACES_EXPORTER='zipkin'" in result.stderr
