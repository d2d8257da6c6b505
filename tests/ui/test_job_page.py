"""The job page (issue 20): why a retrying job waits and until when, the way back to where the
operator came from, every stored byte of a response, each attempt's headers (secrets masked), and
a JSON payload made readable."""

from __future__ import annotations

import html
from datetime import timedelta

import pytest
from django.utils import timezone

from broker import publish
from broker.templatetags.ui_format import utc
from consumers.models import Consumer
from jobs.header_masking import MASK
from jobs.models import Job
from jobs.states import DEAD, QUEUED
from tests.delivery import push_consumer, run_once
from tests.dispatch.test_attempt_headers import URL_SECRET, assert_no_secret_in, secrets_of
from tests.helpers import make_job
from tests.receiver import Reply
from tests.ui.test_dead_jobs import add_attempt

pytestmark = pytest.mark.django_db


def retrying_job() -> Job:
    job = make_job(QUEUED, attempts=2)
    Job.objects.filter(pk=job.pk).update(
        next_attempt_at=timezone.now() + timedelta(minutes=5), last_error="HTTP 503"
    )
    job.refresh_from_db()
    return job


def page(staff_client, job: Job, **headers) -> str:
    response = staff_client.get(f"/ui/jobs/{job.public_id}", headers=headers)
    return str(response.content.decode())


def test_a_retrying_job_says_when_its_next_attempt_is_due(staff_client):
    job = retrying_job()

    shown = page(staff_client, job)

    assert f"due {utc(job.next_attempt_at)}, after 2 failed attempts" in shown
    assert "HTTP 503" in shown


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"paused": True}, "held back: consumer paused"),
        (
            {"circuit_open_until": timedelta(minutes=2)},
            "held back: circuit open until",
        ),
        ({"throttled_until": timedelta(minutes=1)}, "held back: consumer answered 429, held until"),
    ],
)
def test_a_job_held_back_by_its_consumer_says_why(staff_client, change, reason):
    job = retrying_job()
    now = timezone.now()
    values = {k: now + v if isinstance(v, timedelta) else v for k, v in change.items()}
    Consumer.objects.update(**values)

    assert reason in page(staff_client, job)


def test_the_back_link_leads_where_the_operator_came_from(staff_client):
    job = make_job(DEAD, attempts=1)
    came_from = "http://testserver/ui/dead-jobs?consumer=billing&status_code=503"

    assert 'href="/ui/dead-jobs?consumer=billing&amp;status_code=503">← Back' in page(
        staff_client, job, Referer=came_from
    )
    # Elsewhere, another site or no referrer: the dead jobs for a dead job...
    for referer in ["https://elsewhere.example/ui/x", "http://testserver/admin/", ""]:
        assert 'href="/ui/dead-jobs">← Back' in page(staff_client, job, Referer=referer)
    # ... its consumer for a job still on its way.
    queued = retrying_job()
    assert 'href="/ui/consumers/orders/billing">← Back' in page(staff_client, queued)


def test_a_long_response_is_shown_whole_behind_a_control(staff_client):
    job = make_job(DEAD, attempts=1)
    long_answer = "connection to clickhouse:9000 refused; " * 100  # 3,900 characters
    add_attempt(job, status_code=500, response_excerpt=long_answer)
    add_attempt(job, status_code=500, response_excerpt="short")

    shown = page(staff_client, job)

    assert '<details class="excerpt-more">' in shown
    assert long_answer.strip() in shown
    assert ">short<" in shown.replace("\n", "")


def test_a_json_payload_is_indented_and_another_shown_as_it_is(staff_client):
    job = make_job(DEAD, attempts=1)
    job.message.payload, job.message.payload_size = b'{"order":42,"lines":[1]}', 24
    job.message.save()

    assert "{\n  &quot;order&quot;: 42,\n  &quot;lines&quot;: [\n    1\n  ]\n}" in page(
        staff_client, job
    )

    job.message.content_type = "text/plain"
    job.message.save()
    assert "{&quot;order&quot;:42,&quot;lines&quot;:[1]}" in page(staff_client, job)


def test_each_attempt_shows_its_headers_behind_a_control(staff_client):
    job = make_job(DEAD, attempts=3)
    add_attempt(job, status_code=None)  # recorded before attempts kept headers
    add_attempt(job, status_code=None, request_headers=[["webhook-id", "m-1"]])
    add_attempt(
        job,
        status_code=503,
        request_headers=[["webhook-id", "m-1"], ["X-Broker-Metadata-Headers", ""]],
        response_headers=[["X-Receiver", "<b>hook</b>"]],
    )
    add_attempt(job, status_code=200, request_headers=[["webhook-id", "m-1"]])

    shown = page(staff_client, job)

    assert shown.count('<details class="attempt-headers">') == 3
    assert shown.count("<summary>1 sent, 0 received</summary>") == 2
    assert '<p class="no-headers">none: no answer</p>' in shown  # a connection error
    assert '<p class="no-headers">none</p>' in shown  # an answer without headers
    assert "<summary>2 sent, 1 received</summary>" in shown
    assert "<dt>webhook-id</dt><dd>m-1</dd>" in shown
    assert "<dt>X-Broker-Metadata-Headers</dt><dd>(empty)</dd>" in shown
    assert "<dt>X-Receiver</dt><dd>&lt;b&gt;hook&lt;/b&gt;</dd>" in shown


def test_a_failed_attempt_shows_what_was_sent_and_received_and_no_secret(
    staff_client, channel, receiver, dispatcher
):
    consumer = push_consumer(channel, receiver)
    consumer.callback_url = receiver.url().replace("://", f"://alice:{URL_SECRET}@")
    consumer.save()
    receiver.replies["/hook"] = Reply(503, {"X-Receiver": "hook-7"})
    publish(channel, b"{}", producer="shop", message_id="m-1")
    run_once(dispatcher)

    shown = html.unescape(page(staff_client, Job.objects.get()))

    [received] = receiver.received
    assert "<dt>X-Request-ID</dt><dd>" + received.headers["X-Request-ID"] in shown
    assert f"<dt>webhook-signature</dt><dd>v1,{MASK} (masked)</dd>" in shown
    assert f"<dt>X-Broker-Consumer-Token</dt><dd>{MASK} (masked)</dd>" in shown
    assert "<dt>X-Receiver</dt><dd>hook-7</dd>" in shown
    assert_no_secret_in(shown, secrets_of(consumer, received))


def test_the_channel_and_the_consumer_link_to_their_pages(staff_client):
    job = retrying_job()

    shown = page(staff_client, job)

    assert '<a id="channel-link" href="/ui/consumers?channel=orders">orders</a>' in shown
    assert '<a id="consumer-link" href="/ui/consumers/orders/billing">billing</a>' in shown


def test_a_dead_job_is_deleted_from_its_page_after_a_confirmation(staff_client):
    job = make_job(DEAD, attempts=1)
    add_attempt(job)
    shown = page(staff_client, job, referer="http://testserver/ui/dead-jobs?consumer=billing")
    assert 'id="delete-job"' in shown
    assert '<input type="hidden" name="next" value="/ui/dead-jobs?consumer=billing">' in shown
    form = {
        "action": "delete",
        "job": job.public_id,
        "next": "/ui/dead-jobs?consumer=billing",
        "cancel": f"/ui/jobs/{job.public_id}",
    }

    asked = staff_client.post("/ui/dead-jobs/bulk", form)

    assert "<h1>Delete 1 dead job?</h1>" in asked.content.decode()
    assert f'<a href="/ui/jobs/{job.public_id}">Cancel</a>' in asked.content.decode()
    assert Job.objects.filter(pk=job.pk).exists()  # nothing yet
    done = staff_client.post("/ui/dead-jobs/bulk", {**form, "confirmed": "yes"})
    assert done["Location"] == "/ui/dead-jobs?consumer=billing"
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not job.delivery_attempts.exists()  # with its attempts, as the list's delete


def test_only_a_dead_job_offers_delete(staff_client):
    assert 'id="delete-job"' not in page(staff_client, retrying_job())
