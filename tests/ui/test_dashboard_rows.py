"""The dashboard's consumer order and views (broker/ui/dashboard_rows.py), its state badges
(broker/ui/delivery_state.py: state_badges) and the UI's estimate and age filters, on consumers
built in memory: no database (issue 38)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.http import QueryDict

from broker.templatetags.ui_format import estimated_duration, time_ago
from broker.ui.dashboard_rows import ConsumerRow, TableView, ranked, view_links
from broker.ui.delivery_state import DeliveryState, held_back_by, state_badges
from consumers.models import Consumer
from jobs.queue import circuit
from jobs.queue_depth import BoundedCount, QueueDepth
from jobs.stats import Recent, Tally

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
CREATED = NOW - timedelta(days=3)


def consumer(name: str, channel: str = "orders", **fields) -> Consumer:
    fields.setdefault("changed_at", CREATED)
    return Consumer(channel_id=channel, public_id=name, name=name, **fields)


def row(
    name: str,
    *,
    dead: int = 0,
    queued: int = 0,
    delivered: int = 0,
    failed: int = 0,
    latency_bucket: int = 20,
    channel: str = "orders",
    **fields,
) -> ConsumerRow:
    """A consumer's row: its dead and queued jobs, its attempts of the last hour (delivered ones
    all in one latency bucket), its fields (paused, circuit_open_until, ...)."""
    c = consumer(name, channel, **fields)
    count = BoundedCount
    hour = Tally(delivered + failed, delivered, failed, Counter({latency_bucket: delivered}))
    return ConsumerRow(
        consumer=c,
        depth=QueueDepth(count(queued, 1000), count(0, 1000), count(dead, 1000)),
        circuit=circuit.state(c, NOW),
        state=DeliveryState(None, None, held_back_by(c, NOW), state_badges(c, NOW)),
        hour=hour,
        day=hour,
        last_hour=Recent(NOW - timedelta(hours=1), NOW, {}, {}, Tally()),
    )


def names(rows: list[ConsumerRow]) -> list[str]:
    return [r.key for r in rows]


def some_rows() -> list[ConsumerRow]:
    return [
        row("healthy", delivered=100, queued=5),
        row("slow", delivered=100, latency_bucket=40),
        row("flaky", delivered=90, failed=10),  # 10% failing
        row("down", delivered=1, failed=99, circuit_open_until=NOW + timedelta(minutes=1)),
        row("probing", circuit_open_until=NOW - timedelta(seconds=1)),
        row("resting", paused=True),
        row("dead-few", dead=1, delivered=100),
        row("dead-many", dead=40, delivered=100),
        row("dead-and-down", dead=1, circuit_open_until=NOW + timedelta(minutes=1)),
        row("aaa-also-healthy", channel="refunds", delivered=10),
        row("almost-healthy", delivered=99, failed=1),  # 1%: not enough to need attention
    ]


def test_the_most_broken_come_first():
    assert names(ranked(some_rows())) == [
        # Dead jobs first; among them an open circuit, then the failure rate, then more dead.
        "orders/dead-and-down",
        "orders/dead-many",
        "orders/dead-few",
        # Then open circuits, then half-open, then by the share of failures.
        "orders/down",
        "orders/probing",
        "orders/flaky",
        "orders/almost-healthy",
        # Then paused (asked for, not failing); then the rest, by queued jobs, then by name.
        "orders/resting",
        "orders/healthy",
        "orders/slow",
        "refunds/aaa-also-healthy",
    ]


def test_which_need_attention():
    attention = [r.key for r in ranked(some_rows()) if r.needs_attention]

    assert attention == [
        "orders/dead-and-down",
        "orders/dead-many",
        "orders/dead-few",
        "orders/down",
        "orders/probing",
        "orders/flaky",
        "orders/resting",
    ]


def test_a_429_hold_needs_attention_and_reads_as_held():
    held = row("held", delivered=10, throttled_until=NOW + timedelta(seconds=30))

    assert held.needs_attention
    assert [badge.text for badge in held.state.badges] == ["Held: 429"]


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("show=dead", ["orders/dead-and-down", "orders/dead-many", "orders/dead-few"]),
        ("show=circuit-open", ["orders/dead-and-down", "orders/down"]),
        ("show=paused", ["orders/resting"]),
        # Equally slow ones stay most broken first; those without deliveries go last.
        (
            "show=dead&order=latency",
            ["orders/dead-many", "orders/dead-few", "orders/dead-and-down"],
        ),
        ("show=nonsense&order=nonsense", None),  # ignored: everyone, most broken first
    ],
)
def test_views_cut_the_rows_down(query, shown):
    rows = ranked(some_rows())

    view = TableView.of(QueryDict(query))

    assert names(view.rows(rows)) == (shown or names(rows))


def test_the_latency_order_is_slowest_first_then_most_broken():
    rows = ranked(some_rows())

    slowest = names(TableView.of(QueryDict("order=latency")).rows(rows))

    assert slowest[0] == "orders/slow"  # the only one in the slow bucket
    # Without deliveries: last, still most broken first.
    assert slowest[-3:] == ["orders/dead-and-down", "orders/probing", "orders/resting"]


def test_view_links_keep_the_other_choice_and_count_what_they_show():
    rows = ranked(some_rows())

    links = view_links(TableView.of(QueryDict("order=latency&show=paused")), rows)

    show = {link.label: (link.url, link.selected) for link in links["show"]}
    assert show["all (11)"] == ("/ui/?order=latency#consumers", False)
    assert show["with dead jobs (3)"] == ("/ui/?show=dead&order=latency#consumers", False)
    assert show["paused (1)"] == ("/ui/?show=paused&order=latency#consumers", True)
    assert show["needing attention (7)"][0] == "/ui/?show=attention&order=latency#consumers"
    order = {link.label: (link.url, link.selected) for link in links["order"]}
    assert order == {
        "most broken first": ("/ui/?show=paused#consumers", False),
        "slowest first": ("/ui/?show=paused&order=latency#consumers", True),
    }


# --- state badges (broker/ui/delivery_state.py) ------------------------------------------------


def badges(c: Consumer, now: datetime = NOW) -> list[str]:
    return [badge.text for badge in state_badges(c, now)]


def test_active_stands_alone():
    assert badges(consumer("ok")) == ["Active"]
    open_until = NOW + timedelta(minutes=5)
    assert badges(consumer("down", circuit_open_until=open_until)) == ["Circuit open"]
    assert badges(consumer("both", paused=True, circuit_open_until=open_until)) == [
        "Paused",
        "Circuit open",
    ]
    assert badges(consumer("probing", circuit_open_until=NOW)) == ["Circuit half-open"]
    # A hold that is over holds nothing.
    assert badges(consumer("was-held", throttled_until=NOW - timedelta(seconds=1))) == ["Active"]


def test_a_pause_by_a_410_says_so():
    gone = consumer(
        "gone", paused=True, last_failure_at=CREATED + timedelta(days=1), last_failure="HTTP 410"
    )
    assert badges(gone) == ["Paused: 410 Gone"]
    assert held_back_by(gone, NOW) == "consumer paused: it answered 410 Gone"
    assert "410 Gone at 2026-11-27 12:00:00 UTC" in state_badges(gone, NOW)[0].title

    with_answer = consumer(
        "gone", paused=True, last_failure_at=NOW, last_failure="HTTP 410: endpoint removed"
    )
    assert badges(with_answer) == ["Paused: 410 Gone"]
    # changed_at steps in whole seconds and can run ahead of the change by up to one.
    just_saved = consumer(
        "gone",
        paused=True,
        last_failure_at=NOW,
        last_failure="HTTP 410",
        changed_at=NOW + timedelta(milliseconds=900),
    )
    assert badges(just_saved) == ["Paused: 410 Gone"]


@pytest.mark.parametrize(
    ("why", "fields"),
    [
        # Resumed after the 410, then paused by hand: changed_at moved past the 410.
        ("paused by hand since", {"changed_at": CREATED + timedelta(days=2)}),
        ("a second after", {"changed_at": CREATED + timedelta(days=1, seconds=1)}),
        ("another failure", {"last_failure": "HTTP 503: down"}),
        ("not quite a 410", {"last_failure": "HTTP 4100"}),
        ("no failure at all", {"last_failure_at": None, "last_failure": ""}),
    ],
)
def test_a_pause_by_hand_is_a_plain_pause(why, fields):
    gone = consumer(
        "gone", paused=True, last_failure_at=CREATED + timedelta(days=1), last_failure="HTTP 410"
    )
    for name, value in fields.items():
        setattr(gone, name, value)

    assert badges(gone) == ["Paused"], why


# --- ui_format ----------------------------------------------------------------------------------


def test_estimates_look_like_estimates():
    assert estimated_duration(365.2) == "≈ 365 ms"
    assert estimated_duration(4900) == "≈ 4.9 s"
    assert estimated_duration(None) == "—"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-3600, "just now"),  # a clock an hour fast is wrong, but the beat is fresh
        (-1, "just now"),
        (0, "just now"),
        (0.9, "just now"),
        (1, "1 s ago"),
        (89, "89 s ago"),
        (90, "1 min ago"),
        (3599, "59 min ago"),
        (5400, "1 h ago"),
        (47 * 3600, "47 h ago"),
        (3 * 86400, "3 d ago"),
    ],
)
def test_time_ago(seconds, text):
    assert time_ago(timedelta(seconds=seconds)) == text
    assert time_ago(None) == ""
