"""Hostile input to the operator UI (issue 14 §6): no page answers 5xx, and a 400 names what it
refuses.

What tests/reliability/test_bad_input.py and tests/api/test_fuzz.py do for the API, for every route
of broker/ui/urls.py, logged in as a superuser: every query parameter its page reads (recorded while
the page runs, so a parameter added later cannot be missed), every path segment, and the form fields
of the actions, each given hostile values: NUL bytes, huge strings, dates at and past the ends of
the calendar, numbers beyond a bigint, tampered cursors, unicode, path tricks. Then hypothesis sends
generated text to every query parameter.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, unquote, urlencode

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.handlers.wsgi import WSGIRequest
from django.http import QueryDict
from django.test import Client
from django.urls import Resolver404, URLPattern, resolve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import publish
from broker.ui.urls import urlpatterns
from jobs import dlq_actions
from jobs.models import DeliveryReport, Job
from jobs.states import DEAD
from tests.conftest import FORM
from tests.helpers import make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ADMIN_TOKEN = "ui-fuzz-admin-token"

# Hostile values of a query parameter, a path segment or a form field.
HOSTILE = [
    "\x00",
    "a\x00b",
    "\x00~\x00",
    "x" * 5000,
    "9" * 5000,
    "0001-01-01",
    "9999-12-31",
    "10000-01-01",
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-12:00",
    "1969-12-31T23:59:59Z",
    "2030-02-30",
    "-1",
    "0",
    "-9223372036854775809",
    "9223372036854775808",
    "99999999999999999999999999",
    "1e308",
    "NaN",
    "²",
    "١٢٣",
    "~",
    "a~b",
    "0001-01-01~1",
    "2030-01-01T00:00:00+00:00~99999999999999999999",
    "2030-01-01T00:00:00+00:00~-1",
    "orders~\x00",
    "\u202eü\U0001f600",
    "\r\nSet-Cookie: x=1",
    "../",
    "../../etc/passwd",
    "' OR '1'='1",
    " ",
]

# The query parameters each page reads (a page without one is not listed).
QUERY_PARAMETERS = {
    "dashboard": ["show", "order"],
    "dead-jobs": [
        "channel",
        "consumer",
        "message",
        "since",
        "until",
        "status_code",
        "error",
        "cursor",
    ],
    "consumers": ["channel", "after"],
    "consumer": ["status_code", "outcome", "since", "until"],
    "consumer-create": ["channel"],
    "messages": ["q", "channel", "before"],
    "scheduled": ["channel", "cursor"],
    "scheduled-new": ["channel"],
    "periodic": ["channel", "cursor"],
    "periodic-new": ["channel"],
    "reports": ["grain", "channel", "consumer", "since", "until"],
}

# The form fields each action reads, with a valid value of each.
CONSUMER_SETTINGS = {
    "name": "Billing",
    "callback_url": "http://127.0.0.1:9/hook",
    "type": "push",
    "ordering": "none",
    "retry_delays": "1, 2",
    "non_retryable_statuses": "410",
    "max_in_flight": "3",
    "token": "a-token",
    "signing_secret": "",
}
PERIODIC_FIELDS = {
    "producer": "shop",
    "payload": "{}",
    "payloadEncoding": "utf-8",
    "contentType": "application/json",
    "priority": "0",
    "headers": "",
    "orderingKey": "",
    "intervalSeconds": "60",
    "cron": "",
    "timeZone": "UTC",
    "skipWhilePending": "true",
}
FORM_FIELDS: dict[str, dict[str, str | list[str]]] = {
    "bulk-action": {
        "action": "requeue",
        "job": ["0000000000000000000g"],
        "next": "/ui/dead-jobs",
        "confirmed": "yes",
    },
    "matching-action": {"action": "delete", "consumer": "billing", "confirmed": "yes"},
    "requeue-since": {
        "channel": "orders",
        "consumer": "billing",
        "since": "2029-12-31T00:00",
        "confirmed": "yes",
    },
    "message-replay": {"consumer": "billing"},
    "consumer-create": {"channel": "orders", "consumer_id": "new-one", **CONSUMER_SETTINGS},
    "consumer-edit": {**CONSUMER_SETTINGS, "changed_at": "2030-01-01T12:00:00+00:00"},
    "consumer-rotate-secret": {"confirm": "yes"},
    "consumer-reveal-secret": {"confirm": "yes"},
    "scheduled-new": {
        "channel": "orders",
        "producer": "shop",
        "message_id": "",
        "content_type": "application/json",
        "payload": "{}",
        "priority": "0",
        "ordering_key": "",
        "scheduled_for": "2030-06-01T12:00",
    },
    "scheduled-cancel": {"next": "/ui/scheduled"},
    "periodic-new": {"channel": "orders", "id": "", "enabled": "true", **PERIODIC_FIELDS},
    "periodic-message": {**PERIODIC_FIELDS, "changed_at": ""},
    "periodic-enable": {"next": "/ui/periodic"},
    "periodic-disable": {"next": "/ui/periodic"},
    "periodic-delete": {},
}


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


@pytest.fixture
def rows(clock, settings) -> dict[str, object]:
    """One of each thing a UI page shows, and the path segments that name them."""
    settings.BROKER_ADMIN_TOKENS = [ADMIN_TOKEN]
    channel = make_channel("orders")
    make_producer("shop")
    billing = make_consumer(channel, "billing")
    message = publish(channel, b"{}", producer="shop", message_id="m-1")
    Job.objects.filter(message=message).update(status=DEAD)
    publish(channel, b"{}", producer="shop", message_id="later", scheduled_for=NOW + timedelta(1))
    periodic = {"id": "tick", "producer": "shop", "payload": "{}", "intervalSeconds": "60"}
    api = Client(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    created = api.post("/channel/orders/periodic-messages", urlencode(periodic), content_type=FORM)
    assert created.status_code == 201, created.content
    report_row()
    return {
        "channel_id": "orders",
        "consumer_id": "billing",
        "message_id": "later",
        "periodic_id": "tick",
        "job_id": Job.objects.get(message=message).public_id,
        "message_pk": message.pk,
        "action_id": dlq_actions.start(billing, dlq_actions.REQUEUE).public_id,
    }


def report_row() -> None:
    DeliveryReport.objects.create(
        grain="day",
        period_start=NOW.replace(hour=0),
        channel_id="orders",
        consumer_id="billing",
        messages=1,
        jobs=1,
        delivered=1,
        dead=0,
    )


@pytest.fixture
def root(client, clock):
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def routes() -> dict[str, URLPattern]:
    """Every page and action (the redirect of a path with a trailing slash is tested by
    tests/ui/test_home.py)."""
    return {
        str(pattern.name): pattern
        for pattern in urlpatterns
        if isinstance(pattern, URLPattern) and pattern.name != "without-slash"
    }


def path_of(name: str, segments: dict[str, object], **replaced: str) -> str:
    """The route's path with the given segments (URL-quoted) in place of the rows' own."""
    path = "/ui/" + str(routes()[name].pattern)
    for converter, segment in re.findall(r"<(\w+):(\w+)>", path):
        value = replaced.get(segment, str(segments[segment]))
        path = path.replace(f"<{converter}:{segment}>", quote(value, safe=""))
    return path


def assert_answered(response, *names: str) -> None:
    """No 5xx; a 400 is the UI's page naming the parameter it refused (one of `names`)."""
    assert response.status_code < 500, (response.status_code, response.content[:300])
    if response.status_code == 400:
        page = response.content.decode()
        assert any(f"<code>{name}</code>" in page for name in names), page[:500]


def segments_answering(path: str, segment: str) -> set[str]:
    """The path segments of the route that answers `path`: a value with a "/" in it can make
    another route answer (/ui/messages/<channel>/<message ID> for /ui/messages/<pk>)."""
    try:
        return {segment, *resolve(unquote(path)).kwargs}
    except Resolver404:
        return {segment}


# --- the four 500s of issue 14 -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "parameter"),
    [
        ("/ui/consumers?channel=%00", "channel"),
        ("/ui/periodic?cursor=%00~%00", "cursor"),
        ("/ui/consumers/%00/x", "channel_id"),
        ("/ui/reports?grain=day&since=0001-01-01&until=9999-12-31", "since"),
    ],
)
def test_the_reported_500s_are_400_pages_naming_the_parameter(root, rows, url, parameter):
    response = root.get(url)

    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    assert f"<code>{parameter}</code>" in response.content.decode()


def test_an_out_of_range_report_range_names_both_ends(root, rows):
    page = root.get("/ui/reports?since=0001-01-01&until=9999-12-31").content.decode()

    assert "<code>since</code>" in page
    assert "<code>until</code>" in page
    assert "from 1970-01-01 to before 9000-01-01" in page


# --- coverage of the routes and parameters -----------------------------------------------------


def test_every_route_is_fuzzed():
    assert set(routes()) >= set(QUERY_PARAMETERS) | set(FORM_FIELDS)
    # A route that reads neither query parameters nor form fields is fuzzed by its path, and a
    # route that has them must be in the tables above.
    segments = {name for name, pattern in routes().items() if "<" in str(pattern.pattern)}
    assert segments | set(QUERY_PARAMETERS) | set(FORM_FIELDS) == set(routes())


def test_the_fuzzed_parameters_are_those_the_pages_read(root, rows, monkeypatch):
    read = record_query_reads(monkeypatch)
    for name in routes():
        read.clear()
        response = root.get(path_of(name, rows))
        if response.status_code == 405:  # an action: its form fields are fuzzed below
            continue
        assert response.status_code == 200, (name, response.status_code)
        assert sorted(read) == sorted(QUERY_PARAMETERS.get(name, [])), name


def record_query_reads(monkeypatch) -> set[str]:
    """The names a page asks its query parameters for, from now on."""
    read: set[str] = set()

    class Recording(QueryDict):
        def __getitem__(self, key: str):
            read.add(key)
            return super().__getitem__(key)

        def get(self, key: str, default=None):
            read.add(key)
            return super().get(key, default)

        def getlist(self, key: str, default=None):
            read.add(key)
            return super().getlist(key, default)

        def __contains__(self, key: object) -> bool:
            read.add(str(key))
            return super().__contains__(key)

    def query(request: WSGIRequest) -> QueryDict:
        return Recording(request.META.get("QUERY_STRING", ""))

    monkeypatch.setattr(WSGIRequest, "GET", property(query))
    return read


# --- hostile values ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_query_parameters(root, rows, value):
    for name, parameters in QUERY_PARAMETERS.items():
        for parameter in parameters:
            response = root.get(path_of(name, rows), {parameter: value})
            assert_answered(response, parameter)


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_path_segments(root, rows, value):
    for name, pattern in routes().items():
        for segment in re.findall(r"<\w+:(\w+)>", str(pattern.pattern)):
            path = path_of(name, rows, **{segment: value})
            for method in (root.get, root.post):
                assert_answered(method(path), *segments_answering(path, segment))


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_form_fields(root, rows, value):
    """Each field of each action's form, the others valid. Form pages show the errors next to
    their fields; what matters here is that nothing is a 5xx."""
    for name, fields in FORM_FIELDS.items():
        for field in fields:
            form = {**fields, field: value}
            response = root.post(path_of(name, rows), form)
            assert response.status_code < 500, (name, field, response.content[:300])


def test_repeated_and_combined_parameters(root, rows):
    cases = [
        "/ui/dead-jobs?channel=orders&channel=%00",
        "/ui/dead-jobs?since=2030-01-01&until=2029-01-01&cursor=~",
        "/ui/reports?grain=hour&since=1970-01-01&until=8999-12-31",
        "/ui/reports?grain=minute",
        "/ui/messages?q=1&before=1&channel=orders",
        "/ui/consumers?after=orders~billing&after=%00",
    ]
    for url in cases:
        assert root.get(url).status_code < 500, url


# --- generated values --------------------------------------------------------------------------

PAGE_LINKS = ("cursor", "after", "before")  # the parameters of "next page" links
GET_PARAMETERS = [
    (name, parameter) for name, names in QUERY_PARAMETERS.items() for parameter in names
]


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(where=st.sampled_from(GET_PARAMETERS), value=st.text(max_size=300))
def test_generated_query_parameters(root, rows, where, value):
    name, parameter = where
    assert_answered(root.get(path_of(name, rows), {parameter: value}), parameter)


CURSORS = [(name, parameter) for name, parameter in GET_PARAMETERS if parameter in PAGE_LINKS]


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    where=st.sampled_from(CURSORS),
    key=st.one_of(st.text(max_size=40), st.datetimes().map(datetime.isoformat)),
    tiebreaker=st.one_of(st.text(max_size=40), st.integers().map(str)),
)
def test_generated_cursors(root, rows, where, key, tiebreaker):
    """Cursors shaped like the real ones ("<key>~<tie-breaker>"), with any key and tie-breaker."""
    name, parameter = where
    assert_answered(root.get(path_of(name, rows), {parameter: f"{key}~{tiebreaker}"}), parameter)
