"""The operator's tasks of issue 20 end to end in headless Chromium, each on a desktop screen
(1440 by 900) and on a phone (390 by 844): the reason a consumer fails within two clicks of the
dashboard, a retrying job's next attempt and the way back, search by what operators type, bulk
actions that show what they take and ask first, a message opened by its public ID, and filters
that keep what was typed. Deliveries are real: a dispatcher step against a loopback receiver."""

from __future__ import annotations

import pytest

from broker import publish
from consumers.models import Consumer
from jobs.models import Job
from jobs.states import DEAD
from tests.delivery import push_consumer
from tests.helpers import make_channel, make_producer
from tests.receiver import Reply
from tests.ui.browser import browser_test, dispatch_once, log_in

pytestmark = browser_test
REFUSAL = b"connection to clickhouse:9000 refused"
# A receiver's long answer: the page shows its start, and the whole of it on demand.
LONG_ANSWER = REFUSAL + b"; " + b"retrying the pool " * 30 + b"END-OF-ANSWER"


@pytest.fixture
def failing(settings, receiver) -> Consumer:
    """audit's receiver answers 503 saying why; three of its messages failed once each."""
    settings.BROKER_RETRY_JITTER = 0
    settings.BROKER_RETRY_DELAYS = [300]
    make_producer()
    channel = make_channel()
    consumer = push_consumer(channel, receiver, "audit", "/audit")
    receiver.replies["/audit"] = Reply(503, body=REFUSAL)
    for number in range(3):
        publish(channel, {"order": number}, producer="shop", message_id=f"order-{number}")
    assert [result.status_code for result in dispatch_once()] == [503] * 3
    return consumer


def test_the_reason_is_two_clicks_from_the_dashboard(screen, live_server, failing):
    page = screen
    log_in(page, live_server, "/ui/")

    why = page.locator("tr[data-why='orders/audit']")
    assert "clickhouse:9000 refused" in why.locator(".last-failure").inner_text()
    page.locator("tr[data-consumer='orders/audit'] a", has_text="audit").click()
    page.wait_for_url("**/ui/consumers/orders/audit")
    assert "clickhouse:9000 refused" in page.locator("#last-failure").inner_text()
    assert page.locator("#next-attempt").inner_text().startswith("due ")

    page.select_option("select[name=outcome]", "5xx")
    page.locator("form.filters button[type=submit]").first.click()
    # count() does not wait: the filtered page must have loaded, not the one before it.
    page.wait_for_url("**/ui/consumers/orders/audit?*outcome=5xx*")
    attempts = page.locator("table.attempts tbody tr")
    assert attempts.count() == 3
    attempts.first.locator("a[href^='/ui/jobs/']").click()
    page.wait_for_url("**/ui/jobs/*")
    assert page.locator("#next-attempt").inner_text().startswith("due ")
    page.locator("a.back").click()  # back to where the operator came from, filter kept
    page.wait_for_url("**/ui/consumers/orders/audit?*outcome=5xx*")


def test_an_attempt_opens_to_its_whole_answer_and_its_headers(
    screen, live_server, failing, receiver
):
    page = screen
    receiver.replies["/audit"] = Reply(503, {"X-Pool": "clickhouse-2"}, LONG_ANSWER)
    Job.objects.update(next_attempt_at=Job.objects.earliest("pk").created_at)  # due again now
    assert [result.status_code for result in dispatch_once()] == [503] * 3
    job = Job.objects.earliest("pk")
    log_in(page, live_server, f"/ui/jobs/{job.public_id}")

    latest = page.locator("table.attempts tbody tr").last
    assert not latest.get_by_text("END-OF-ANSWER").is_visible()
    latest.locator(".excerpt-more summary").click()
    assert latest.get_by_text("END-OF-ANSWER").is_visible()
    headers = latest.locator("details.attempt-headers")
    headers.locator("summary").click()
    shown = headers.inner_text()
    assert "clickhouse-2" in shown  # the answer's
    assert "v1,•••• (masked)" in shown  # the signature sent, masked
    assert page.locator("pre.payload").first.inner_text().startswith("{\n")  # indented JSON


def test_find_dead_jobs_by_the_answer_and_delete_after_a_preview(screen, live_server, failing):
    page = screen
    Job.objects.update(status=DEAD)
    log_in(page, live_server, "/ui/dead-jobs?error=CLICKHOUSE")

    rows = page.locator("#dead-job-table tbody tr")
    assert rows.count() == 3
    rows.first.locator("input[type=checkbox]").check()
    page.locator("button", has_text="Delete selected").last.click()  # the one under the rows
    assert page.locator("h1").inner_text() == "Delete 1 dead job?"
    assert page.locator("table.sample tbody tr").count() == 1
    page.locator("#confirm").click()
    page.wait_for_url("**/ui/dead-jobs?error=CLICKHOUSE")
    assert page.locator("#dead-job-table tbody tr").count() == 2
    assert Job.objects.count() == 2

    page.locator("#matching button", has_text="Requeue all matching").click()
    assert page.locator("h1").inner_text() == "Requeue 2 dead jobs?"
    page.locator("form.toolbar a", has_text="Cancel").click()  # nothing changes
    page.wait_for_url("**/ui/dead-jobs?error=CLICKHOUSE")
    assert Job.objects.filter(status=DEAD).count() == 2


def test_a_message_opens_by_its_id_and_a_bad_filter_keeps_what_was_typed(
    screen, live_server, failing
):
    page = screen
    log_in(page, live_server, "/ui/messages/orders/order-1")
    assert "order-1" in page.locator("h1").inner_text()

    page.goto(f"{live_server.url}/ui/dead-jobs?since=yesterday&error=clickhouse")
    assert "since" in page.locator(".form-errors").inner_text()
    assert page.input_value("input[name=since]") == "yesterday"
    assert page.input_value("input[name=error]") == "clickhouse"
    assert page.evaluate("document.documentElement.scrollWidth") <= page.viewport_size["width"]
