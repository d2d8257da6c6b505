"""The operator UI's Content-Security-Policy (broker/ui/csp.py; issue 14 §6).

Every /ui/ response and the admin login page carry the policy; the rest of the site does not
(the admin's other pages keep Django's own headers). The templates hold nothing the policy would
block: no inline script, no event handler attribute, no inline style. In real Chromium:
tests/ui/test_browser_csp.py.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from broker.ui.csp import HEADER, POLICY
from tests import ROOT
from tests.helpers import make_channel, make_consumer, make_job

pytestmark = pytest.mark.django_db

TEMPLATES = ROOT / "templates" / "ui"
DIRECTIVES = [
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "connect-src 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
    "base-uri 'none'",
    "object-src 'none'",
]


@pytest.fixture
def root(client):
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def test_the_policy_has_the_directives_and_no_unsafe_source():
    directives = [part.strip() for part in POLICY.split(";")]
    assert set(DIRECTIVES) <= set(directives)
    assert "unsafe" not in POLICY


def test_every_ui_answer_carries_the_policy(root):
    job = make_job()
    consumer = make_consumer(make_channel("refunds"), "billing")
    pages = [
        "/ui/",
        "/ui/dead-jobs",
        f"/ui/jobs/{job.public_id}",
        "/ui/consumers",
        f"/ui/consumers/{consumer.channel_id}/{consumer.public_id}",
        "/ui/messages",
        "/ui/scheduled",
        "/ui/periodic",
        "/ui/reports",
        "/ui/consumers?channel=%00",  # the 400 page
        "/ui/jobs/123456789",  # a 404
    ]
    for url in pages:
        assert root.get(url)[HEADER] == POLICY, url
    # A redirect after an action, and a refused method.
    assert root.post(f"/ui/jobs/{job.public_id}/requeue")[HEADER] == POLICY
    assert root.get(f"/ui/jobs/{job.public_id}/requeue")[HEADER] == POLICY


def test_the_login_page_carries_it_and_the_rest_of_the_site_does_not(client, root):
    assert client.get("/admin/login/")[HEADER] == POLICY
    assert client.get("/ui/dead-jobs")[HEADER] == POLICY  # the redirect to the login page

    assert HEADER not in root.get("/admin/")
    assert HEADER not in root.get("/admin/jobs/job/")
    assert HEADER not in client.get("/_status")


@pytest.mark.parametrize("template", sorted(TEMPLATES.glob("*.html")), ids=lambda path: path.name)
def test_templates_have_no_inline_script_or_style(template):
    text = template.read_text()

    assert not re.search(r"<script(?![^>]*\bsrc=)", text), "inline <script>"
    assert not re.search(r"\son[a-z]+\s*=", text), "event handler attribute"
    assert not re.search(r"<style|\sstyle\s*=", text), "inline style"
    assert "javascript:" not in text
