"""Tracing with OpenTelemetry (optional: `pip install '.[otel]'`), and the W3C trace context that a
message keeps (docs/observability.md).

Off unless the standard OTEL_* variables ask for it (`exporter_names`). Then `configure`, run once
per process when the apps are ready, sets up the SDK, and `publish_span` and `attempt_span`
record a span per publish and per push attempt. Off, nothing of OpenTelemetry is ever imported,
and each of those costs a check of one module global.

On or off, a producer's `traceparent` (and `tracestate`) is validated (`parse`: a malformed one is
ignored, never an error) and kept with the message; each push delivery sends the message's trace
context on as `traceparent`, so a trace runs producer → broker → consumer: through the broker's
spans when tracing is on, from the producer's span straight to the consumer's when it is off.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

import broker
from broker.env import env_bool, env_list, env_str

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
EXPORTERS = ("otlp", "console")  # OTEL_TRACES_EXPORTER values the broker can honour
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
OTLP_PROTOCOL = "http/protobuf"  # the exporter of the [otel] extra
DEFAULT_SERVICE_NAME = "webhook-broker"
MAX_TRACESTATE_LENGTH = 512  # what W3C asks every vendor to pass on
MAX_TRACESTATE_MEMBERS = 32

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_TRACESTATE_MEMBER = re.compile(
    r"([a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)

# The tracer spans are made with; None: tracing is off in this process.
_tracer: Tracer | None = None


@dataclass(frozen=True)
class TraceContext:
    """A valid W3C trace context: what a message keeps and a delivery sends."""

    traceparent: str  # always version 00: 00-<trace id>-<parent id>-<flags>
    tracestate: str = ""

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]

    def headers(self) -> dict[str, str]:
        if self.tracestate:
            return {TRACEPARENT: self.traceparent, TRACESTATE: self.tracestate}
        return {TRACEPARENT: self.traceparent}


def parse(traceparent: str | None, tracestate: str | None = None) -> TraceContext | None:
    """The trace context of these header values; None when `traceparent` is missing or malformed.

    A version above 00 is read as version 00 (its first four fields), as W3C asks, and kept in
    that form. A malformed `tracestate` (or one over 32 members or 512 characters) is dropped,
    and the `traceparent` kept.
    """
    value = (traceparent or "").strip(" \t")
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace_id, parent_id, flags = match.groups()
    if version == "ff" or (version == "00" and len(value) != 55):
        return None
    if len(value) > 55 and value[55] != "-":
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return TraceContext(f"00-{trace_id}-{parent_id}-{flags}", _tracestate(tracestate))


def _tracestate(value: str | None) -> str:
    members = [member.strip(" \t") for member in (value or "").split(",")]
    members = [member for member in members if member]
    if len(members) > MAX_TRACESTATE_MEMBERS:
        return ""
    matches = [_TRACESTATE_MEMBER.fullmatch(member) for member in members]
    keys = [match.group(1) for match in matches if match]
    if len(keys) != len(members) or len(set(keys)) != len(keys):
        return ""
    joined = ",".join(members)
    return joined if len(joined) <= MAX_TRACESTATE_LENGTH else ""


# --- configuration ---------------------------------------------------------------------------


def exporter_names() -> tuple[str, ...]:
    """The span exporters the OTEL_* variables ask for; () when tracing is off.

    On with OTEL_TRACES_EXPORTER=otlp and/or console, or, when that is unset, with an OTLP
    endpoint (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT); off with
    OTEL_TRACES_EXPORTER=none, OTEL_SDK_DISABLED=true, or nothing set. A value the broker cannot
    honour, or tracing asked for without the [otel] packages, stops start-up naming the variable.
    """
    if env_bool("OTEL_SDK_DISABLED", False):
        return ()
    names = tuple(name.lower() for name in env_list("OTEL_TRACES_EXPORTER", []))
    if names == ("none",):
        return ()
    if names:
        if not set(names) <= set(EXPORTERS):
            raise ImproperlyConfigured(
                f"OTEL_TRACES_EXPORTER={','.join(names)!r}: the broker exports spans with "
                "otlp (OTLP over HTTP), console, or both; or none."
            )
        asked_by = "OTEL_TRACES_EXPORTER"
    else:
        endpoints = [name for name in ENDPOINT_VARIABLES if env_str(name, "").strip()]
        if not endpoints:
            return ()
        names, asked_by = ("otlp",), endpoints[0]
    if "otlp" in names:
        _check_protocol()
    _require_packages(asked_by, names)
    return names


def _check_protocol() -> None:
    for variable in PROTOCOL_VARIABLES:
        value = env_str(variable, "").strip()
        if value and value != OTLP_PROTOCOL:
            raise ImproperlyConfigured(
                f"{variable}={value!r}: the broker's OTLP exporter speaks {OTLP_PROTOCOL} "
                "(port 4318 by default) only."
            )


def _require_packages(asked_by: str, names: tuple[str, ...]) -> None:
    modules = ["opentelemetry.sdk.trace"]
    if "otlp" in names:
        modules.append("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    try:
        missing = [module for module in modules if importlib.util.find_spec(module) is None]
    except ModuleNotFoundError:  # a parent package is not there at all
        missing = modules
    if missing:
        raise ImproperlyConfigured(
            f"{asked_by} turns tracing on, which needs the optional OpenTelemetry packages: "
            "pip install 'webhook-broker-django[otel]' (or -r requirements-otel.txt)."
        )


def configure() -> None:
    """Start tracing in this process if the OTEL_* variables ask for it (AppConfig.ready).

    A host project that already set up OpenTelemetry (its own TracerProvider) keeps it: the
    broker's spans go to that provider, and the OTEL_* variables are the host's business.
    """
    host_provider = _provider_set_by_host()
    if host_provider is not None:
        use(host_provider)
        return
    names = exporter_names()
    if not names:
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):  # nobody has set one up: ours
        provider = _sdk_provider(names)
        trace.set_tracer_provider(provider)
    use(provider)


def _provider_set_by_host() -> TracerProvider | None:
    """The provider a host project set before the broker's apps were ready, if any. A host that
    set one has imported the API; looking in sys.modules keeps OpenTelemetry unimported here."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    return None if isinstance(provider, trace.ProxyTracerProvider) else provider


def _sdk_provider(names: tuple[str, ...]) -> TracerProvider:
    """The SDK's provider with a batch processor per exporter. The SDK reads the rest of the
    OTEL_* variables itself: endpoint, headers, sampler, batch sizes, resource attributes."""
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    resource = Resource({SERVICE_VERSION: broker.__version__}).merge(resource)
    provider = TracerProvider(resource=resource)
    for name in names:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    return provider


def use(provider: TracerProvider | None) -> None:
    """Record spans with `provider` from now on; None turns tracing off (tests use both)."""
    global _tracer  # one tracer per process, set at start-up
    _tracer = None if provider is None else provider.get_tracer("broker", broker.__version__)


def enabled() -> bool:
    return _tracer is not None


# --- spans -------------------------------------------------------------------------------------


def publish_span(
    channel_id: str, message_id: str, producer_id: str, given: TraceContext | None
) -> AbstractContextManager[TraceContext | None]:
    """Around one publish: gives the trace context to keep with the message.

    Off: `given` (the producer's, kept as it came). On: the context of a new span `publish
    <channel>`, child of the current span when there is one (a host project's, or a server
    span of Django instrumentation), else of `given`, else the root of a new trace.
    """
    if _tracer is None:
        return nullcontext(given)
    return _publish_span(_tracer, channel_id, message_id, producer_id, given)


@contextmanager
def _publish_span(
    tracer: Tracer, channel_id: str, message_id: str, producer_id: str, given: TraceContext | None
) -> Iterator[TraceContext | None]:
    from opentelemetry import trace

    parent = None  # the current context
    if given is not None and not trace.get_current_span().get_span_context().is_valid:
        parent = _context(given)
    attributes = {
        "messaging.operation.type": "send",
        "messaging.destination.name": channel_id,
        "messaging.message.id": message_id,
        "broker.producer.id": producer_id,
    }
    with tracer.start_as_current_span(
        f"publish {channel_id}", parent, trace.SpanKind.PRODUCER, attributes
    ) as span:
        yield _context_of(span)


class AttemptSpan:
    """A push attempt's span, as `attempt_span` gives it; this base is what tracing off gives."""

    headers: Mapping[str, str] = {}  # the trace context to send (none: the request's own)

    def record(self, status_code: int | None, error_class: str, error: str) -> None:
        """The attempt's result: the HTTP status, or the class of error when none came."""


_NO_SPAN = AttemptSpan()


def attempt_span(
    given: TraceContext | None,
    *,
    channel_id: str,
    message_id: str,
    consumer_id: str,
    job_id: str,
    attempt: int,
    url: str,
) -> AbstractContextManager[AttemptSpan]:
    """Around one push attempt: a span `deliver <channel>`, child of the message's trace context
    (`given`; the root of a new trace when the message has none), whose context the request
    sends. Off: no span, and the request sends the message's own context."""
    if _tracer is None:
        return nullcontext(_NO_SPAN)
    attributes = {
        "messaging.operation.type": "process",
        "messaging.destination.name": channel_id,
        "messaging.message.id": message_id,
        "broker.consumer.id": consumer_id,
        "broker.job.id": job_id,
        "broker.delivery.attempt": attempt,
        "http.request.method": "POST",
        **_server(url),
    }
    return _attempt_span(_tracer, given, f"deliver {channel_id}", attributes)


def _server(url: str) -> dict[str, Any]:
    """Where a request goes, without the parts of a URL that may hide a secret (userinfo, path,
    query). Nothing for a URL that does not parse: its request fails as it is made."""
    try:
        target = urlsplit(url)
        port = target.port or (443 if target.scheme == "https" else 80)
    except ValueError:
        return {}
    return {
        "url.scheme": target.scheme,
        "server.address": target.hostname or "",
        "server.port": port,
    }


@contextmanager
def _attempt_span(
    tracer: Tracer, given: TraceContext | None, name: str, attributes: dict[str, Any]
) -> Iterator[AttemptSpan]:
    from opentelemetry import trace

    parent = _context(given)  # never the current one: a dispatcher's task has none of its own
    with tracer.start_as_current_span(name, parent, trace.SpanKind.CLIENT, attributes) as span:
        yield _RecordingAttemptSpan(span)


class _RecordingAttemptSpan(AttemptSpan):
    def __init__(self, span: Span) -> None:
        context = _context_of(span)
        self.headers = context.headers() if context else {}
        self._span = span

    def record(self, status_code: int | None, error_class: str, error: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        if status_code is not None:
            self._span.set_attribute("http.response.status_code", status_code)
        if error_class:
            self._span.set_attribute("error.type", error_class)
            self._span.set_status(Status(StatusCode.ERROR, error))


def _context(given: TraceContext | None) -> Context:
    """An OpenTelemetry context whose remote parent is `given` (empty for None)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(given.headers() if given else {})


def _context_of(span: Span) -> TraceContext | None:
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, set_span_in_context(span))
    return parse(carrier.get(TRACEPARENT), carrier.get(TRACESTATE))
