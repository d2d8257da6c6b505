"""Accessibility of the operator UI (issue 38, docs/ui.md "Accessibility"), in headless Chromium
at 1440 px: the contrast of every visible text in both colour schemes, the skip link, the focus
ring, filter errors tied to their fields, and room between a confirmation and its Cancel."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from broker import publish
from broker.models import Channel
from broker.periodic_edits import PeriodicMessagePostForm, create_periodic
from jobs.models import Job
from jobs.queue import take_for_pull
from tests.ui.browser import DESKTOP, browser_test, chromium_page, log_in
from tests.ui.test_browser_consumers import some_consumers
from tests.ui.test_reports import TODAY, report_row

pytestmark = browser_test

SCHEMES = ["light", "dark"]

# Each visible text under 4.5:1 (3:1 if large) against its background, described (the file's
# comment says how); without the comment, which page.evaluate would not take as a function.
LOW_CONTRAST = "\n".join(
    line
    for line in Path(__file__).with_name("low_contrast.js").read_text().splitlines()
    if not line.startswith("//")
)

# Where the keyboard is: the focused element and its outline.
FOCUS_RING = """() => {
  const element = document.activeElement;
  const style = getComputedStyle(element);
  return {
    tag: element.tagName.toLowerCase(),
    visible: element.matches(":focus-visible"),
    style: style.outlineStyle,
    width: parseFloat(style.outlineWidth),
    colour: style.outlineColor,
  };
}"""


@pytest.fixture
def wide_page(chromium):
    """Chromium at 1440 px, the operator review's desktop width."""
    yield from chromium_page(chromium, DESKTOP)


def an_operators_day() -> dict[str, str]:
    """Something on every page: consumers in every state, a dead job with its error, a
    scheduled and a periodic message, two weeks of delivery reports."""
    some_consumers("http://127.0.0.1:9/hook")
    message = publish("orders", b'{"n": 1}', producer="shop", message_id="a11y-1")
    job = Job.objects.get(message=message, consumer__public_id="warehouse")  # a pull consumer
    take_for_pull(job)
    job.mark_dead("HTTP 503: down for maintenance")
    later = timezone.now() + timedelta(days=1)
    publish("orders", b"{}", producer="shop", message_id="later", scheduled_for=later)
    form = PeriodicMessagePostForm(data={"producer": "shop", "payload": "{}", "cron": "@daily"})
    assert form.is_valid(), form.errors
    create_periodic(Channel.objects.get(pk="orders"), "tick", dict(form.validated_data))
    for day in range(14):
        report_row("billing", TODAY - timedelta(days=day), dead=day % 3)
    return {"job": job.public_id, "message": str(message.pk)}


def main_pages(ids: dict[str, str]) -> list[str]:
    return [
        "/ui/",
        "/ui/dead-jobs",
        "/ui/dead-jobs?since=yesterday",  # a filter refused: the error box
        f"/ui/jobs/{ids['job']}",
        "/ui/consumers",
        "/ui/consumers/orders/billing",
        "/ui/consumers/orders/billing/edit",
        "/ui/consumers/new",
        "/ui/consumers/orders/billing/secret/rotate",
        "/ui/messages",
        f"/ui/messages/{ids['message']}",
        "/ui/scheduled",
        "/ui/periodic",
        "/ui/reports",
        "/ui/no-such-page",
    ]


def test_every_text_has_enough_contrast_in_both_colour_schemes(screen, live_server):
    """On a desktop and on a phone, whose pages show cards instead of some tables."""
    pages = main_pages(an_operators_day())
    log_in(screen, live_server, "/ui/")

    failures = []
    for scheme in SCHEMES:
        screen.emulate_media(color_scheme=scheme)
        for path in pages:
            screen.goto(f"{live_server.url}{path}")
            found = screen.evaluate(LOW_CONTRAST)
            failures += [f"{scheme} {path}: {failure}" for failure in found]

    assert not failures, "\n".join(failures)


def test_the_contrast_check_finds_text_too_faint(wide_page, live_server):
    """The check above can fail: grey on near-black, as the dark "Auto-refresh" label was."""
    log_in(wide_page, live_server, "/ui/")
    wide_page.goto(f"{live_server.url}/ui/no-such-page")
    wide_page.emulate_media(color_scheme="dark")
    # Through the CSSOM, which the policy allows (it governs markup and files, not scripts).
    wide_page.evaluate(
        "() => { const p = document.createElement('p'); p.className = 'faint';"
        " p.textContent = 'Auto-refresh'; p.style.color = 'rgb(75, 85, 99)';"
        " p.hidden = true; document.querySelector('main').append(p); }"
    )
    assert wide_page.evaluate(LOW_CONTRAST) == []  # hidden text is not judged
    wide_page.evaluate("() => { document.querySelector('p.faint').hidden = false; }")

    failures = wide_page.evaluate(LOW_CONTRAST)

    assert len(failures) == 1
    assert failures[0].startswith('p.faint text "Auto-refresh": 2.3')  # 2.35:1


def test_the_skip_link_comes_first_and_leads_past_the_navigation(live_server, screen):
    page = screen
    some_consumers("http://127.0.0.1:9/hook")
    log_in(page, live_server, "/ui/dead-jobs")

    skip = page.locator("a.skip-link")
    assert skip.bounding_box()["y"] < 0  # out of sight until the keyboard reaches it
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    assert skip.bounding_box()["y"] >= 0  # in sight once focused
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")

    assert page.url.endswith("/ui/dead-jobs#content")
    assert page.evaluate("!!document.activeElement.closest('main')")  # not the navigation


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_keyboard_focus_shows_a_ring(wide_page, live_server, scheme):
    some_consumers("http://127.0.0.1:9/hook")
    wide_page.emulate_media(color_scheme=scheme)
    log_in(wide_page, live_server, "/ui/dead-jobs")

    rings: dict[str, dict[str, Any]] = {}
    for _ in range(40):  # through the navigation's links to the filter's button
        wide_page.keyboard.press("Tab")
        ring = wide_page.evaluate(FOCUS_RING)
        rings.setdefault(ring["tag"], ring)
        if "button" in rings:
            break

    assert set(rings) >= {"a", "input", "button"}
    for ring in rings.values():
        assert ring["visible"], ring
        assert ring["style"] == "solid", ring  # not Chromium's faint default ("auto", 1 px)
        assert ring["width"] >= 2, ring


def test_a_refused_filter_is_described_by_its_problem(wide_page, live_server):
    from playwright.sync_api import expect

    some_consumers("http://127.0.0.1:9/hook")
    log_in(wide_page, live_server, "/ui/dead-jobs")
    wide_page.goto(f"{live_server.url}/ui/dead-jobs?since=yesterday&error=timeout")

    filters = wide_page.locator("form.filters").first  # not the requeue-since form below
    since = filters.locator("input[name=since]")
    problem = wide_page.locator("#filter-error-since").inner_text()
    assert problem.startswith("since: ")
    assert since.get_attribute("aria-invalid") == "true"
    # Chromium's accessibility tree: what a screen reader says on reaching each field.
    expect(since).to_have_accessible_description(problem)
    expect(filters.locator("input[name=error]")).to_have_accessible_description("")


def test_a_confirmation_keeps_its_action_apart_from_cancel(live_server, screen):
    page = screen
    some_consumers("http://127.0.0.1:9/hook")
    log_in(page, live_server, "/ui/dead-jobs")
    page.locator("input[name=job]").first.check()
    page.locator("button[value=requeue]").first.click()
    page.wait_for_selector("#confirm")

    def gap(action: str) -> float:
        """From the right edge of the action's button to the left edge of Cancel."""
        button = page.locator(action).bounding_box()
        cancel = page.get_by_role("link", name="Cancel").bounding_box()
        assert button is not None
        assert cancel is not None
        return float(cancel["x"] - (button["x"] + button["width"]))

    gaps = {"requeue dead jobs": gap("#confirm")}
    page.goto(f"{live_server.url}/ui/consumers/orders/billing/secret/rotate")
    gaps["rotate a secret"] = gap("button.danger")

    assert all(found >= 15 for found in gaps.values()), gaps  # 1rem; the words' space was 4 px
