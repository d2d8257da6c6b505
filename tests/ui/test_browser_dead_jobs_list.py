"""Issue 38's dead jobs list, job page and report axes in headless Chromium, on a desktop screen
(1440 by 900) and a phone (390 by 844): select-all and the buttons above the rows, the number of
matches, the message filter and quick ranges, example dates that read as examples in both
themes, the job page's links, its Delete and its uncounted probe, and hourly report labels whose
boxes never meet (docs/ui.md)."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from jobs.models import Job
from jobs.queue.circuit import PROBE_NOT_COUNTED
from jobs.states import QUEUED
from tests.helpers import make_job
from tests.ui.browser import browser_test, log_in
from tests.ui.test_dead_jobs import add_attempt, dead_job
from tests.ui.test_reports import TODAY, report_row

pytestmark = browser_test


def fits_the_screen(page) -> bool:
    width = page.evaluate("document.documentElement.scrollWidth")
    return bool(width <= page.viewport_size["width"])


def test_select_all_then_delete_from_above_the_rows(screen, live_server):
    page = screen
    for minutes in range(3):
        dead_job(died_ago=timedelta(minutes=minutes))
    log_in(page, live_server, "/ui/dead-jobs")

    assert page.locator("#match-count").inner_text() == "3 dead jobs match"
    rows = page.locator("#dead-job-table tbody input[type=checkbox]")
    select_all = page.locator("input[data-select-all]")
    select_all.check()
    assert page.locator("#dead-job-table tbody input:checked").count() == 3
    rows.first.uncheck()
    assert page.evaluate("document.querySelector('input[data-select-all]').indeterminate")
    select_all.check()
    assert page.locator("#dead-job-table tbody input:checked").count() == 3
    assert fits_the_screen(page)

    above = page.locator(".list-head button", has_text="Delete selected")
    assert above.bounding_box()["y"] < page.locator("#dead-job-table").bounding_box()["y"]
    above.click()
    assert page.locator("h1").inner_text() == "Delete 3 dead jobs?"
    page.locator("#confirm").click()
    page.wait_for_url("**/ui/dead-jobs")
    assert not Job.objects.exists()


def test_filter_by_message_then_act_on_all_matching_from_above(screen, live_server):
    page = screen
    wanted, _ = dead_job(), dead_job()
    log_in(page, live_server, "/ui/dead-jobs")

    page.fill("input[name=message]", wanted.message.public_id)
    page.locator("form.filters button", has_text="Filter").click()
    page.wait_for_url("**message=**")
    assert page.locator("#dead-job-table tbody tr").count() == 1
    assert page.locator("#match-count").inner_text() == "1 dead job matches"
    page.locator(".list-head button", has_text="Requeue all matching").click()
    assert page.locator("h1").inner_text() == "Requeue 1 dead job?"
    page.locator("#confirm").click()
    page.wait_for_url("**message=**")
    assert Job.objects.get(pk=wanted.pk).status == QUEUED
    assert Job.objects.filter(status=QUEUED).count() == 1


def test_the_last_hour_in_one_click(screen, live_server):
    page = screen
    recent = dead_job(died_ago=timedelta(minutes=30))
    dead_job(died_ago=timedelta(hours=2))
    log_in(page, live_server, "/ui/dead-jobs?channel=orders")

    page.locator("#quick-ranges a", has_text="Last hour").click()
    page.wait_for_url("**since=**")
    assert "channel=orders" in page.url
    assert page.locator("#dead-job-table tbody tr").count() == 1
    assert recent.public_id in page.locator("#dead-job-table").inner_text()
    assert page.input_value("input[name=since]")  # what it filters by, as a value


def contrast(first: list[float], second: list[float]) -> float:
    """WCAG's contrast ratio of two sRGB colours (0-255 each)."""

    def luminance(rgb: list[float]) -> float:
        linear = [
            c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
            for c in (v / 255 for v in rgb)
        ]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    light, dark = sorted([luminance(first), luminance(second)], reverse=True)
    return (light + 0.05) / (dark + 0.05)


COLOURS = """() => {
  const field = document.querySelector("input[name=since]");
  const rgb = (text) => text.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const placeholder = getComputedStyle(field, "::placeholder");
  const own = getComputedStyle(field);
  return {placeholder: rgb(placeholder.color), italic: placeholder.fontStyle,
          value: rgb(own.color), background: rgb(own.backgroundColor)};
}"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_example_dates_read_as_examples(screen, live_server, scheme):
    page = screen
    page.emulate_media(color_scheme=scheme)
    log_in(page, live_server, "/ui/dead-jobs")

    assert page.get_attribute("input[name=since]", "placeholder").startswith("e.g. ")
    colours = page.evaluate(COLOURS)
    assert colours["italic"] == "italic"
    assert colours["placeholder"] != colours["value"]
    assert contrast(colours["placeholder"], colours["background"]) >= 4.5


def test_the_job_page_links_counts_and_deletes(screen, live_server):
    page = screen
    job = dead_job(error="HTTP 503")
    log_in(page, live_server, "/ui/dead-jobs?consumer=billing")
    page.click(f"a[href='/ui/jobs/{job.public_id}']")
    page.wait_for_url(f"**/ui/jobs/{job.public_id}")

    page.locator("#consumer-link").click()
    page.wait_for_url("**/ui/consumers/orders/billing")
    page.go_back()
    page.locator("#channel-link").click()
    page.wait_for_url("**/ui/consumers?channel=orders")
    page.go_back()

    page.locator("#delete-job button").click()
    assert page.locator("h1").inner_text() == "Delete 1 dead job?"
    page.locator("form.toolbar a", has_text="Cancel").click()  # back to the job, still there
    page.wait_for_url(f"**/ui/jobs/{job.public_id}")
    # Come from the confirmation page, "Back" leads to the dead jobs, not to the action's URL.
    assert page.get_attribute("a.back", "href") == "/ui/dead-jobs"
    page.locator("#delete-job button").click()
    page.locator("#confirm").click()
    page.wait_for_url("**/ui/dead-jobs")
    assert page.locator(".messages").inner_text().startswith("Deleted 1 of the 1 selected job")
    assert not Job.objects.filter(pk=job.pk).exists()


def test_a_failed_probe_is_labelled_not_counted(screen, live_server):
    page = screen
    job = make_job(QUEUED, attempts=2)
    Job.objects.filter(pk=job.pk).update(last_error=f"HTTP 503; {PROBE_NOT_COUNTED}")
    for _ in range(3):
        add_attempt(job, status_code=503)
    log_in(page, live_server, f"/ui/jobs/{job.public_id}")

    assert page.locator("#attempt-count").inner_text().startswith("2 of ")
    rows = page.locator("table.attempts tbody tr")
    assert rows.count() == 3
    assert rows.nth(2).locator(".tag").inner_text() == "circuit probe, not counted"
    assert rows.nth(2).locator(".tag").is_visible()
    assert not rows.nth(1).locator(".tag").count()
    assert fits_the_screen(page)


X_LABEL_BOXES = """() => [...document.querySelectorAll(".report-charts svg")].map((svg) => ({
  svg: svg.getBoundingClientRect().toJSON(),
  labels: [...svg.querySelectorAll(".x-axis text")].map((t) => t.getBoundingClientRect().toJSON()),
}))"""


def test_hourly_report_labels_never_meet(screen, live_server):
    page = screen
    for hours in range(0, 48, 3):
        report_row("billing", TODAY - timedelta(hours=hours), grain="hour")
    log_in(page, live_server, "/ui/reports")
    for query in ("grain=hour", "grain=hour&since=2000-01-01", "grain=day"):  # 48, 336, 30
        page.goto(f"{live_server.url}/ui/reports?{query}")
        charts = page.evaluate(X_LABEL_BOXES)

        assert len(charts) == 3
        for chart in charts:
            labels = chart["labels"]
            assert len(labels) >= 3
            for left, right in itertools.pairwise(labels):
                assert left["right"] < right["left"]  # apart, none on top of the next
            assert chart["svg"]["left"] <= labels[0]["left"]
            assert labels[-1]["right"] <= chart["svg"]["right"]
        assert fits_the_screen(page)
