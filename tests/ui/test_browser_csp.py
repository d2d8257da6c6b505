"""The UI's Content-Security-Policy in headless Chromium (broker/ui/csp.py): the main pages, the
admin
login page and the confirmation dialogs work under it, and Chromium reports no violation.

Chromium reports each blocked script, style or form target as a `securitypolicyviolation` event;
a script Playwright adds before any page script (which no page policy restricts) collects them.
The last test checks that the collection works: an inline handler added to a page is blocked
and reported.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from broker import publish
from broker.periodic_edits import PeriodicMessagePostForm, create_periodic
from jobs.models import Job
from jobs.queue import take_for_pull
from tests.helpers import make_channel, make_consumer, make_producer
from tests.ui.browser import browser_test, log_in

pytestmark = browser_test

COLLECT_VIOLATIONS = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.cspViolations.push(`${event.violatedDirective} blocked ${event.blockedURI}`);
});
"""


def rows() -> dict[str, str]:
    """Something on every page: a dead job, a delivered message, a scheduled and a periodic."""
    channel = make_channel("orders")
    make_producer("shop")
    make_consumer(channel, "billing")
    dead = publish(channel, b'{"n": 1}', producer="shop", message_id="m-1")
    job = Job.objects.get(message=dead)
    take_for_pull(job)
    job.mark_dead("HTTP 503")
    later = timezone.now() + timedelta(days=1)
    publish(channel, b"{}", producer="shop", message_id="later", scheduled_for=later)
    form = PeriodicMessagePostForm(data={"producer": "shop", "payload": "{}", "cron": "@daily"})
    assert form.is_valid(), form.errors
    create_periodic(channel, "tick", dict(form.validated_data))
    return {"job": job.public_id, "message": str(dead.pk)}


def watched(page) -> list[str]:
    """Console messages about the policy from the pages opened from now on (Chromium logs each
    violation there as well; other errors, such as the missing favicon's 404, do not count)."""
    logged: list[str] = []
    page.add_init_script(COLLECT_VIOLATIONS)

    def keep(message) -> None:
        if "Content Security Policy" in message.text:
            logged.append(message.text)

    page.on("console", keep)
    return logged


def violations(page) -> list[str]:
    return list(page.evaluate("window.cspViolations"))


def test_the_main_pages_run_without_a_violation(page, live_server):
    ids = rows()
    errors = watched(page)
    log_in(page, live_server, "/ui/")  # through the admin's login page, which has the policy too
    pages = [
        "/ui/",
        "/ui/dead-jobs",
        f"/ui/jobs/{ids['job']}",
        "/ui/consumers",
        "/ui/consumers/orders/billing",
        "/ui/consumers/orders/billing/edit",
        "/ui/consumers/orders/billing/secret/reveal",
        "/ui/consumers/new",
        "/ui/messages",
        f"/ui/messages/{ids['message']}",
        "/ui/scheduled",
        "/ui/scheduled/new",
        "/ui/scheduled/orders/later",
        "/ui/periodic",
        "/ui/periodic/new",
        "/ui/periodic/orders/tick",
        "/ui/reports",
        "/ui/reports?since=0001-01-01",  # the 400 page
    ]
    for path in pages:
        page.goto(f"{live_server.url}{path}")
        assert violations(page) == [], path
    assert errors == []


def test_confirmations_work_under_the_policy(page, live_server):
    rows()
    errors = watched(page)
    log_in(page, live_server, "/ui/scheduled")

    dialogs: list[str] = []

    def dismiss(dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    page.click("button:text('Cancel')")
    assert dialogs == ["Cancel scheduled message later? It is deleted and never sent."]
    assert page.locator("table.scheduled tbody tr").count() == 1  # dismissed: nothing sent

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:text('Cancel')")
    page.wait_for_selector("text=was cancelled")
    assert violations(page) == []
    assert errors == []


def test_an_inline_handler_is_blocked_and_reported(page, live_server):
    watched(page)
    log_in(page, live_server, "/ui/")

    reported = page.expect_console_message(
        lambda message: "Content Security Policy" in message.text
    )
    with reported:
        page.evaluate(
            """document.body.insertAdjacentHTML(
                "beforeend", '<img src="/static/ui/none.png" onerror="window.ranInline = true">'
            )"""
        )
    page.wait_for_function("window.cspViolations.length > 0")

    assert page.evaluate("window.ranInline === undefined")
    assert any(violation.startswith("script-src") for violation in violations(page))
