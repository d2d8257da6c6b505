"""Every screen (issue 20): each page of the UI usable on a phone (390 CSS pixels wide, at its
real size rather than zoomed out, nothing wider than the screen but tables that scroll inside
the page), and in the system's dark mode. In headless Chromium (tests/ui/browser.py).

Set UI_SCREENSHOTS=1 to refresh docs/screenshots/phone-*.png and dark-dashboard.png.
"""

from __future__ import annotations

import pytest

from jobs.states import DEAD, QUEUED
from tests.helpers import make_job
from tests.ui.browser import browser_test, log_in, screenshot
from tests.ui.test_browser_consumers import some_consumers

pytestmark = browser_test

# Each page, and the name of its phone screenshot in docs/screenshots (None: not kept).
PAGES = [
    ("/ui/", "phone-dashboard.png"),
    ("/ui/consumers", None),
    ("/ui/consumers/orders/billing", "phone-consumer.png"),
    ("/ui/consumers/orders/billing/edit", None),
    ("/ui/dead-jobs", "phone-dead-jobs.png"),
    ("/ui/messages", None),
    ("/ui/scheduled", None),
    ("/ui/periodic", None),
    ("/ui/reports", None),
    ("/ui/no-such-page", None),
]

WIDEST_ELEMENT = """() => {
  // The right edge of the widest element that is not inside a scrolling box of its own.
  const inScroller = (el) => {
    for (let up = el.parentElement; up; up = up.parentElement) {
      const overflow = getComputedStyle(up).overflowX;
      if (overflow === "auto" || overflow === "scroll") return true;
    }
    return false;
  };
  let widest = 0, what = "";
  for (const el of document.body.querySelectorAll("*")) {
    if (inScroller(el)) continue;
    const right = el.getBoundingClientRect().right;
    if (right > widest) { widest = right; what = el.tagName + "." + el.className; }
  }
  return [widest, what];
}"""


def test_every_page_fits_a_phone_at_its_real_size(phone_page, live_server):
    some_consumers("http://127.0.0.1:9/hook")
    make_job(DEAD, attempts=3)
    make_job(QUEUED)
    log_in(phone_page, live_server, "/ui/")

    for path, shot in PAGES:
        phone_page.goto(f"{live_server.url}{path}")
        # Without <meta name="viewport"> a phone lays the page out 980 px wide and zooms out.
        assert phone_page.evaluate("window.innerWidth") == 390, path
        assert phone_page.evaluate("document.documentElement.scrollWidth") <= 390, path
        widest, what = phone_page.evaluate(WIDEST_ELEMENT)
        assert widest <= 391, f"{path}: {what} reaches {widest} px"
        size = phone_page.evaluate("parseFloat(getComputedStyle(document.body).fontSize)")
        assert size >= 14, path
        if shot:
            screenshot(phone_page, shot)


def test_wide_tables_scroll_inside_the_page_and_controls_can_be_tapped(phone_page, live_server):
    some_consumers("http://127.0.0.1:9/a-rather-long-callback-path/that-goes/on-and-on")
    make_job(DEAD, attempts=3)
    log_in(phone_page, live_server, "/ui/dead-jobs")

    table = phone_page.locator("table").first
    assert table.evaluate("t => getComputedStyle(t).overflowX") == "auto"
    box = phone_page.locator("input[type=checkbox]").first.bounding_box()
    assert box is not None
    assert box["width"] >= 20
    assert box["height"] >= 20
    navigation = phone_page.locator("header nav a")
    for index in range(navigation.count()):
        link = navigation.nth(index).bounding_box()
        assert link is not None
        assert link["x"] + link["width"] <= 390


@pytest.mark.parametrize(
    ("scheme", "background"), [("light", "rgb(246, 247, 249)"), ("dark", "rgb(17, 24, 39)")]
)
def test_the_ui_follows_the_systems_colour_scheme(page, live_server, scheme, background):
    some_consumers("http://127.0.0.1:9/hook")
    page.emulate_media(color_scheme=scheme)
    log_in(page, live_server, "/ui/")

    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == background
    table = page.locator("table").first
    colour = table.evaluate("t => getComputedStyle(t).backgroundColor")
    assert colour == ("rgb(31, 41, 55)" if scheme == "dark" else "rgb(255, 255, 255)")
    if scheme == "dark":
        screenshot(page, "dark-dashboard.png")


def test_the_dashboard_refreshes_its_figures_in_place_once_asked(page, live_server):
    some_consumers("http://127.0.0.1:9/hook")
    page.clock.install()  # the page's timers on a clock the test moves: no 10 s wait
    log_in(page, live_server, "/ui/")
    dead = page.locator("#tiles .tile:has-text('Dead') .tile-value")
    before = dead.inner_text()
    page.evaluate("window.notReloaded = true")

    page.check("input[data-auto-refresh]")
    make_job(DEAD, attempts=2)
    page.clock.run_for(10_000)  # the dashboard's "every 10 s"
    # A selector, not wait_for_function: the policy forbids evaluating strings as script.
    page.wait_for_selector("html[data-refreshed-at]", state="attached", timeout=60_000)

    assert dead.inner_text() == str(int(before) + 1)
    assert page.evaluate("window.notReloaded") is True  # swapped in place, not reloaded
    page.reload()
    assert page.locator("input[data-auto-refresh]").is_checked()  # the choice is remembered
