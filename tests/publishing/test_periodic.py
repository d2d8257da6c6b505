"""Periodic messages (docs/periodic.md): tick times, the REST API, publishing ticks, the admin."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import pytest
import time_machine
from django.utils.http import http_date

from broker.models import Message, PeriodicMessage
from broker.periodic import next_tick, run_due_ticks, tick_message_id
from jobs.models import Job
from jobs.queue import take_for_pull
from tests.conftest import FORM
from tests.helpers import at_once, make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
URL = "/channel/orders/periodic-message"
START = datetime(2025, 1, 1, 12, tzinfo=UTC)  # when saved schedules are first due


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, micro: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)


def schedule(**fields) -> PeriodicMessage:
    """An unsaved schedule (next_tick needs only the schedule's fields)."""
    return PeriodicMessage(**{"public_id": "p", "timezone": "UTC", **fields})


def ticks(cron: str, zone: str, after: datetime, count: int) -> list[datetime]:
    result, periodic = [], schedule(cron=cron, timezone=zone)
    for _ in range(count):
        after = next_tick(periodic, after)
        result.append(after)
    return result


def local(instants: list[datetime], zone: ZoneInfo) -> list[str]:
    return [instant.astimezone(zone).strftime("%m-%d %H:%M%z") for instant in instants]


def save_schedule(public_id: str = "daily", **fields) -> PeriodicMessage:
    periodic = PeriodicMessage(
        channel_id="orders",
        producer_id="shop",
        public_id=public_id,
        payload=b'{"report": true}',
        content_type="application/json",
        **{"interval_seconds": 60, "next_run_at": START, **fields},
    )
    periodic.save()
    return periodic


# --- when a schedule ticks ------------------------------------------------------------------


def test_an_interval_counts_from_the_previous_tick_so_it_never_drifts():
    every_minute = schedule(interval_seconds=60)
    tick = utc(2025, 1, 1, 12)

    assert next_tick(every_minute, tick) == utc(2025, 1, 1, 12, 1)
    assert next_tick(every_minute, next_tick(every_minute, tick)) == utc(2025, 1, 1, 12, 2)


def test_cron_in_utc():
    assert ticks("*/15 * * * *", "UTC", utc(2025, 1, 1, 10, 7, 30), 3) == [
        utc(2025, 1, 1, 10, 15),
        utc(2025, 1, 1, 10, 30),
        utc(2025, 1, 1, 10, 45),
    ]
    # Strictly after: a tick time itself is not its own next tick.
    assert ticks("0 9 * * 1-5", "UTC", utc(2025, 1, 3, 9), 2) == [  # Friday 09:00
        utc(2025, 1, 6, 9),
        utc(2025, 1, 7, 9),
    ]


def test_cron_follows_the_wall_clock_of_its_time_zone():
    # 09:00 in Berlin is 08:00 UTC in winter and 07:00 UTC in summer.
    assert ticks("0 9 * * *", "Europe/Berlin", utc(2025, 1, 1), 1) == [utc(2025, 1, 1, 8)]
    assert ticks("0 9 * * *", "Europe/Berlin", utc(2025, 7, 1), 1) == [utc(2025, 7, 1, 7)]


def test_a_daily_time_skipped_by_spring_forward_runs_shifted_by_the_gap_once():
    # 2024-03-31 in Berlin: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that day.
    daily = ticks("30 2 * * *", "Europe/Berlin", utc(2024, 3, 29, 12), 3)

    assert local(daily, BERLIN) == ["03-30 02:30+0100", "03-31 03:30+0200", "04-01 02:30+0200"]


def test_a_daily_time_repeated_by_fall_back_runs_once_at_its_first_occurrence():
    # 2024-10-27 in Berlin: 03:00 CEST becomes 02:00 CET; 02:30 happens twice.
    daily = ticks("30 2 * * *", "Europe/Berlin", utc(2024, 10, 25, 12), 3)

    assert local(daily, BERLIN) == ["10-26 02:30+0200", "10-27 02:30+0200", "10-28 02:30+0100"]
    assert daily[2] - daily[1] == timedelta(hours=25)


def test_an_hourly_schedule_keeps_its_rhythm_through_both_changes():
    fall_back = ticks("30 * * * *", "Europe/Berlin", utc(2024, 10, 26, 23), 4)
    spring_forward = ticks("30 * * * *", "Europe/Berlin", utc(2024, 3, 31), 3)

    assert local(fall_back, BERLIN) == [
        "10-27 01:30+0200",
        "10-27 02:30+0200",
        "10-27 02:30+0100",  # the repeated hour runs too: hourly means every hour
        "10-27 03:30+0100",
    ]
    assert local(spring_forward, BERLIN) == [
        "03-31 01:30+0100",
        "03-31 03:30+0200",  # the 02:30 that does not exist and 03:30 are one tick
        "03-31 04:30+0200",
    ]
    assert {b - a for a, b in pairwise(fall_back)} == {timedelta(hours=1)}


def test_new_york_across_its_dst_changes():
    # 2024-03-10: 02:00 EST becomes 03:00 EDT. 2024-11-03: 02:00 EDT becomes 01:00 EST.
    spring = ticks("30 2 * * *", "America/New_York", utc(2024, 3, 9, 12), 2)
    fall = ticks("30 1 * * *", "America/New_York", utc(2024, 11, 2, 12), 2)
    quarter_hours = ticks("*/30 * * * *", "America/New_York", utc(2024, 11, 3, 5, 10), 4)

    assert local(spring, NEW_YORK) == ["03-10 03:30-0400", "03-11 02:30-0400"]
    assert local(fall, NEW_YORK) == ["11-03 01:30-0400", "11-04 01:30-0500"]
    assert local(quarter_hours, NEW_YORK) == [
        "11-03 01:30-0400",
        "11-03 01:00-0500",
        "11-03 01:30-0500",
        "11-03 02:00-0500",
    ]


def test_the_31st_runs_only_in_months_that_have_one():
    assert ticks("0 0 31 * *", "UTC", utc(2025, 1, 31, 12), 4) == [
        utc(2025, 3, 31),
        utc(2025, 5, 31),
        utc(2025, 7, 31),
        utc(2025, 8, 31),
    ]


def test_february_29_runs_in_leap_years_only():
    assert ticks("0 0 29 2 *", "UTC", utc(2024, 2, 1), 3) == [
        utc(2024, 2, 29),
        utc(2028, 2, 29),
        utc(2032, 2, 29),
    ]


def test_the_last_day_of_every_month():
    assert ticks("0 0 L * *", "UTC", utc(2024, 1, 31, 1), 2) == [utc(2024, 2, 29), utc(2024, 3, 31)]


def test_the_message_id_of_a_tick_names_the_schedule_and_the_time():
    assert tick_message_id(schedule(), utc(2025, 3, 1, 2, 30)) == "p-20250301T023000Z"
    long_id = tick_message_id(schedule(public_id="x" * 255), utc(2025, 3, 1))
    assert len(long_id) <= 255
    assert long_id.endswith("-20250301T000000Z")


# --- publishing ticks ------------------------------------------------------------------------


@pytest.fixture
def orders():
    channel = make_channel("orders")
    make_producer("shop")
    return channel


def test_a_due_tick_publishes_one_message_with_a_job_per_consumer(orders):
    make_consumer(orders, "billing")
    make_consumer(orders, "audit")
    periodic = save_schedule(priority=5, headers={"X-Kind": "report"}, ordering_key="r")
    due = START

    assert run_due_ticks(now=due - timedelta(seconds=1)) == 0
    assert run_due_ticks(now=due) == 1
    assert run_due_ticks(now=due) == 0

    message = Message.objects.get()
    assert message.public_id == "daily-20250101T120000Z"
    assert (message.status, message.priority, message.headers) == (
        "DISPATCHED",
        5,
        {"X-Kind": "report"},
    )
    assert (message.ordering_key, message.content_type) == ("r", "application/json")
    assert bytes(message.payload) == b'{"report": true}'
    assert set(message.jobs.values_list("consumer__public_id", flat=True)) == {"billing", "audit"}
    periodic.refresh_from_db()
    assert (periodic.last_run_at, periodic.last_message) == (due, message)
    assert periodic.next_run_at == due + timedelta(seconds=60)
    assert periodic.skipped_ticks == 0


def test_a_channel_without_consumers_still_gets_its_message(orders):
    save_schedule()

    assert run_due_ticks(now=START) == 1
    assert Message.objects.get().status == Message.Status.ACKNOWLEDGED


def test_ticks_do_not_change_the_schedule_for_if_unmodified_since(orders):
    periodic = save_schedule()

    run_due_ticks(now=START)

    assert PeriodicMessage.objects.get().changed_at == periodic.changed_at


def test_disabled_schedules_do_not_tick(orders):
    save_schedule(enabled=False)

    assert run_due_ticks(now=START + timedelta(days=1)) == 0
    assert not Message.objects.exists()


def test_after_a_long_downtime_one_message_is_published_not_hundreds(orders):
    periodic = save_schedule()  # every minute from 12:00
    back_at = utc(2025, 1, 1, 22, 0, 30)  # ten hours later

    assert run_due_ticks(now=back_at) == 1

    message = Message.objects.get()
    assert message.public_id == "daily-20250101T220000Z"  # the latest missed tick
    periodic.refresh_from_db()
    assert periodic.skipped_ticks == 600  # 12:00 to 21:59
    assert periodic.last_run_at == utc(2025, 1, 1, 22)
    assert periodic.next_run_at == utc(2025, 1, 1, 22, 1)  # on the grid, in the future


def test_a_cron_schedule_catches_up_with_one_message_too(orders):
    periodic = save_schedule(interval_seconds=None, cron="* * * * *", next_run_at=utc(2025, 1, 1))
    back_at = utc(2025, 1, 3, 0, 0, 30)  # two days: more missed ticks than are counted

    assert run_due_ticks(now=back_at) == 1

    assert Message.objects.get().public_id == "daily-20250103T000000Z"
    periodic.refresh_from_db()
    assert periodic.next_run_at == utc(2025, 1, 3, 0, 1)
    assert periodic.skipped_ticks >= 1000
    assert run_due_ticks(now=back_at) == 0


def test_skip_while_pending_skips_until_the_previous_message_is_delivered(orders):
    make_consumer(orders, "billing")
    periodic = save_schedule(skip_while_pending=True)
    start = START

    assert run_due_ticks(now=start) == 1
    job = Job.objects.get()
    assert run_due_ticks(now=start + timedelta(minutes=1)) == 0  # queued
    take_for_pull(job)
    assert run_due_ticks(now=start + timedelta(minutes=2)) == 0  # in flight
    periodic.refresh_from_db()
    assert periodic.skipped_ticks == 2
    assert periodic.next_run_at == start + timedelta(minutes=3)

    job.mark_delivered()
    assert run_due_ticks(now=start + timedelta(minutes=3)) == 1
    assert Message.objects.count() == 2
    assert PeriodicMessage.objects.get().last_run_at == start + timedelta(minutes=3)


def test_skip_while_pending_does_not_wait_for_dead_jobs(orders):
    make_consumer(orders, "billing")
    save_schedule(skip_while_pending=True)
    run_due_ticks(now=START)
    job = Job.objects.get()
    take_for_pull(job)
    job.mark_dead("gave up")

    assert run_due_ticks(now=START + timedelta(minutes=1)) == 1


def test_a_tick_already_published_is_not_published_again(orders):
    save_schedule()
    run_due_ticks(now=START)
    # Moved back by hand (or a second dispatcher with a stale view): the message ID refuses it.
    PeriodicMessage.objects.update(next_run_at=START)

    assert run_due_ticks(now=START) == 0
    assert Message.objects.count() == 1
    assert PeriodicMessage.objects.get().next_run_at == START + timedelta(minutes=1)


@pytest.mark.django_db(transaction=True)
def test_concurrent_dispatchers_publish_each_tick_exactly_once():
    make_channel("orders")
    make_producer("shop")
    due = utc(2025, 1, 1, 12)
    for number in range(50):
        save_schedule(f"p{number}", next_run_at=due)
    results: list[int] = []

    def dispatcher() -> None:
        results.append(run_due_ticks(now=due + timedelta(seconds=30)))

    at_once(*[dispatcher] * 4)

    assert sum(results) == 50
    assert Message.objects.count() == 50
    assert set(Message.objects.values_list("public_id", flat=True)) == {
        f"p{number}-20250101T120000Z" for number in range(50)
    }
    assert not PeriodicMessage.objects.filter(next_run_at__lte=due + timedelta(seconds=30))


# --- the REST API ----------------------------------------------------------------------------


def put(client, url, data, **headers):
    return client.put(url, urlencode(data), content_type=FORM, headers=headers)


def post(client, data):
    return client.post("/channel/orders/periodic-messages", urlencode(data), content_type=FORM)


EVERY_MINUTE = {"producer": "shop", "payload": '{"ping": 1}', "intervalSeconds": "60"}


@time_machine.travel(utc(2025, 1, 1, 12, 0, 0, 500000), tick=False)
def test_put_creates_a_schedule_and_get_reads_it(admin_client, orders):
    response = put(
        admin_client,
        f"{URL}/ping",
        {**EVERY_MINUTE, "contentType": "application/json", "headers": '{"X-Kind": "ping"}'},
    )

    assert response.status_code == 200
    body = response.json()
    assert body == {
        "ID": "ping",
        "ProducerID": "shop",
        "Payload": '{"ping": 1}',
        "PayloadEncoding": "utf-8",
        "ContentType": "application/json",
        "Priority": 0,
        "Headers": {"X-Kind": "ping"},
        "OrderingKey": "",
        "EventType": None,
        "IntervalSeconds": 60,
        "Cron": None,
        "TimeZone": "UTC",
        "Enabled": True,
        "SkipWhilePending": False,
        "NextRunAt": "2025-01-01T12:01:00Z",  # on a whole second
        "LastRunAt": None,
        "LastMessageID": None,
        "SkippedTicks": 0,
        "ChangedAt": body["ChangedAt"],
    }
    read = admin_client.get(f"{URL}/ping")
    assert read.json() == body
    assert read["Last-Modified"] == http_date(PeriodicMessage.objects.get().changed_at.timestamp())


def test_post_creates_with_a_location_and_refuses_a_duplicate_id(admin_client, orders):
    response = post(admin_client, {**EVERY_MINUTE, "id": "ping"})

    assert response.status_code == 201
    assert response["Location"] == f"{URL}/ping"
    assert post(admin_client, {**EVERY_MINUTE, "id": "ping"}).status_code == 409
    generated = post(admin_client, EVERY_MINUTE)
    assert generated.status_code == 201
    assert len(generated.json()["ID"]) == 32


def test_a_cron_schedule_in_a_time_zone(admin_client, orders):
    with time_machine.travel(utc(2025, 7, 1, 12), tick=False):
        response = put(
            admin_client,
            f"{URL}/morning",
            {"producer": "shop", "payload": "hi", "cron": "0 9 * * *", "timeZone": "Europe/Berlin"},
        )

    body = response.json()
    assert (body["Cron"], body["IntervalSeconds"], body["TimeZone"]) == (
        "0 9 * * *",
        None,
        "Europe/Berlin",
    )
    assert body["NextRunAt"] == "2025-07-02T07:00:00Z"


def test_update_needs_if_unmodified_since_and_keeps_omitted_fields(admin_client, orders):
    created = put(admin_client, f"{URL}/ping", EVERY_MINUTE)
    stamp = created["Last-Modified"]

    assert put(admin_client, f"{URL}/ping", {"priority": "3"}).status_code == 400
    assert (
        put(
            admin_client,
            f"{URL}/ping",
            {"priority": "3"},
            If_Unmodified_Since="Thu, 01 Jan 2015 00:00:00 GMT",
        ).status_code
        == 412
    )
    updated = put(admin_client, f"{URL}/ping", {"priority": "3"}, If_Unmodified_Since=stamp)

    assert updated.status_code == 200
    assert (updated.json()["Priority"], updated.json()["Payload"]) == (3, '{"ping": 1}')
    assert updated.json()["NextRunAt"] == created.json()["NextRunAt"]  # the schedule is the same


def test_switching_from_an_interval_to_cron(admin_client, orders):
    stamp = put(admin_client, f"{URL}/ping", EVERY_MINUTE)["Last-Modified"]

    body = put(admin_client, f"{URL}/ping", {"cron": "0 * * * *"}, If_Unmodified_Since=stamp).json()

    assert (body["IntervalSeconds"], body["Cron"]) == (None, "0 * * * *")
    assert body["NextRunAt"].endswith(":00:00Z")


def test_disabling_clears_the_next_run_and_enabling_sets_it_from_now(admin_client, orders):
    with time_machine.travel(utc(2025, 1, 1, 12), tick=False):
        stamp = put(admin_client, f"{URL}/ping", EVERY_MINUTE)["Last-Modified"]
        disabled = put(admin_client, f"{URL}/ping", {"enabled": "false"}, If_Unmodified_Since=stamp)
    assert (disabled.json()["Enabled"], disabled.json()["NextRunAt"]) == (False, None)

    with time_machine.travel(utc(2025, 1, 2, 8, 30), tick=False):
        enabled = put(
            admin_client,
            f"{URL}/ping",
            {"enabled": "true"},
            If_Unmodified_Since=disabled["Last-Modified"],
        )
    assert enabled.json()["NextRunAt"] == "2025-01-02T08:31:00Z"


def test_list_and_delete(admin_client, orders):
    for number in range(30):
        post(admin_client, {**EVERY_MINUTE, "id": f"p{number}"})

    first = admin_client.get("/channel/orders/periodic-messages").json()
    second = admin_client.get(first["Pages"]["next"]).json()
    assert len(first["Result"]) == 25
    assert len(set(first["Result"] + second["Result"])) == 30
    assert f"{URL}/p29" in first["Result"]

    stamp = admin_client.get(f"{URL}/p0")["Last-Modified"]
    assert admin_client.delete(f"{URL}/p0").status_code == 400
    assert admin_client.delete(f"{URL}/p0", headers={"If-Unmodified-Since": stamp}).status_code == (
        204
    )
    assert admin_client.get(f"{URL}/p0").status_code == 404
    assert admin_client.get("/channel/nope/periodic-messages").status_code == 404


def test_a_binary_payload_in_base64(admin_client, orders):
    body = put(
        admin_client, f"{URL}/bin", {**EVERY_MINUTE, "payload": "AP8=", "payloadEncoding": "base64"}
    ).json()

    assert (body["Payload"], body["PayloadEncoding"]) == ("AP8=", "base64")
    assert bytes(PeriodicMessage.objects.get().payload) == b"\x00\xff"


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"cron": "* * * * *"}, "either intervalSeconds or cron"),
        ({"intervalSeconds": None}, "intervalSeconds or cron"),
        ({"intervalSeconds": "0"}, "intervalSeconds"),
        ({"intervalSeconds": "soon"}, "intervalSeconds"),
        ({"intervalSeconds": None, "cron": "61 * * * *"}, "Invalid cron"),
        ({"intervalSeconds": None, "cron": "* * * * * *"}, "5 fields"),
        ({"intervalSeconds": None, "cron": "0 0 30 2 *"}, "never matches"),
        ({"intervalSeconds": None, "cron": "@reboot"}, "5 fields"),
        ({"timeZone": "Mars/Olympus"}, "Unknown time zone"),
        ({"timeZone": "../../etc/passwd"}, "Unknown time zone"),
        ({"producer": "nobody"}, "No producer"),
        ({"producer": None}, "needs producer"),
        ({"payload": None}, "needs payload"),
        ({"payload": ""}, "payload"),
        ({"payloadEncoding": "base64", "payload": "*"}, "base64"),
        ({"headers": "[1]"}, "JSON object"),
        ({"headers": '{"bad name": "x"}'}, "header name"),
        ({"priority": str(2**31)}, "priority"),
        ({"orderingKey": "a\nb"}, "ordering key"),
    ],
)
def test_invalid_schedules_are_refused_with_a_clear_error(admin_client, orders, change, error):
    data = {key: value for key, value in {**EVERY_MINUTE, **change}.items() if value is not None}

    response = put(admin_client, f"{URL}/bad", data)

    assert response.status_code == 400
    assert error in response.json()["Error"]
    assert not PeriodicMessage.objects.exists()


def test_bad_ids_and_media_types(admin_client, orders):
    assert put(admin_client, f"{URL}/a.b", EVERY_MINUTE).status_code == 400
    assert post(admin_client, {**EVERY_MINUTE, "id": "a b"}).status_code == 400
    assert admin_client.put(
        f"{URL}/ok", EVERY_MINUTE, content_type="application/json"
    ).status_code == (415)
    assert put(admin_client, "/channel/nope/periodic-message/ok", EVERY_MINUTE).status_code == 404


def test_the_api_needs_admin_credentials(client, orders):
    assert client.get("/channel/orders/periodic-messages").status_code == 401
    assert put(client, f"{URL}/ping", EVERY_MINUTE).status_code == 401


def test_a_tick_shows_in_the_api(admin_client, orders):
    put(admin_client, f"{URL}/ping", EVERY_MINUTE)
    due = PeriodicMessage.objects.get().next_run_at
    assert due is not None
    run_due_ticks(now=due)

    body = admin_client.get(f"{URL}/ping").json()
    assert body["LastMessageID"] == tick_message_id(PeriodicMessage.objects.get(), due)
    assert admin_client.get(f"/channel/orders/message/{body['LastMessageID']}").status_code == 200


# --- the admin -------------------------------------------------------------------------------


def test_admin_pages_and_enable_disable_actions(superuser_client, orders):
    periodic = save_schedule(cron="0 9 * * *", interval_seconds=None, timezone="Europe/Berlin")

    assert superuser_client.get("/admin/broker/periodicmessage/").status_code == 200
    page = superuser_client.get(f"/admin/broker/periodicmessage/{periodic.pk}/change/")
    assert page.status_code == 200
    assert b"0 9 * * *" in page.content

    actions = "/admin/broker/periodicmessage/"
    superuser_client.post(actions, {"action": "disable", "_selected_action": [periodic.pk]})
    periodic.refresh_from_db()
    assert (periodic.enabled, periodic.next_run_at) == (False, None)

    with time_machine.travel(utc(2025, 1, 1, 12), tick=False):
        superuser_client.post(actions, {"action": "enable", "_selected_action": [periodic.pk]})
    periodic.refresh_from_db()
    assert (periodic.enabled, periodic.next_run_at) == (True, utc(2025, 1, 2, 8))


def test_admin_changes_are_validated_and_move_the_next_run(superuser_client, orders):
    periodic = save_schedule()
    url = f"/admin/broker/periodicmessage/{periodic.pk}/change/"
    form = {
        "content_type": "application/json",
        "priority": "0",
        "headers": "{}",
        "ordering_key": "",
        "interval_seconds": "",
        "cron": "0 9 * * *",
        "timezone": "Mars/Olympus",
        "enabled": "on",
    }

    assert b"Unknown time zone" in superuser_client.post(url, form).content
    with time_machine.travel(utc(2025, 1, 1, 12), tick=False):
        response = superuser_client.post(url, {**form, "timezone": "Europe/Berlin"})

    assert response.status_code == 302
    periodic.refresh_from_db()
    assert (periodic.cron, periodic.interval_seconds) == ("0 9 * * *", None)
    assert periodic.next_run_at == utc(2025, 1, 2, 8)


def test_a_schedules_event_type_goes_with_its_ticks(admin_client, orders):
    for name, patterns in {"billing": ["report.*"], "audit": ["audit.*"]}.items():
        consumer = make_consumer(orders, name)
        consumer.event_types = patterns
        consumer.save()
    typed = {**EVERY_MINUTE, "eventType": "report.daily"}
    assert put(admin_client, f"{URL}/ping", typed).status_code == 200
    refused = put(admin_client, f"{URL}/bad", {**typed, "eventType": "no spaces"})
    assert refused.status_code == 400
    assert "Event type" in refused.json()["Error"]
    due = PeriodicMessage.objects.get().next_run_at
    assert due is not None

    run_due_ticks(now=due)

    body = admin_client.get(f"{URL}/ping").json()
    assert body["EventType"] == "report.daily"
    message = Message.objects.get(public_id=body["LastMessageID"])
    assert message.event_type == "report.daily"
    assert [job.consumer.public_id for job in Job.objects.filter(message=message)] == ["billing"]
