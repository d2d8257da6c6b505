"""Prometheus metrics: the queue per consumer from the database, dispatcher totals."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import DispatcherHeartbeat
from jobs.states import DEAD, INFLIGHT, QUEUED
from tests.helpers import make_job

pytestmark = pytest.mark.django_db


def test_metrics_need_an_admin_unless_public(client, settings):
    assert client.get("/metrics").status_code == 401
    settings.BROKER_PUBLIC_METRICS = True
    assert client.get("/metrics").status_code == 200


def test_metrics_report_jobs_per_consumer_and_dispatchers(admin_client):
    for status in (QUEUED, QUEUED, INFLIGHT, DEAD):
        make_job(status)
    DispatcherHeartbeat.objects.create(
        dispatcher_id="d1",
        hostname="h",
        pid=1,
        started_at=timezone.now(),
        last_beat_at=timezone.now(),
        in_flight=3,
        delivered=10,
        failed=2,
    )

    text = admin_client.get("/metrics").content.decode()

    assert 'broker_jobs_queued{channel="orders",consumer="billing"} 2.0' in text
    assert 'broker_jobs_in_flight{channel="orders",consumer="billing"} 1.0' in text
    assert 'broker_jobs_dead{channel="orders",consumer="billing"} 1.0' in text
    assert 'broker_dispatcher_in_flight{dispatcher="d1"} 3.0' in text
    assert 'broker_dispatcher_attempts_total{dispatcher="d1",result="delivered"} 10.0' in text


def test_metrics_report_pause_and_circuit_per_consumer(admin_client):
    from datetime import timedelta

    from consumers.models import Consumer
    from tests.helpers import make_channel, make_consumer

    channel = make_channel()
    make_consumer(channel, "paused")
    make_consumer(channel, "down")
    Consumer.objects.filter(public_id="paused").update(paused=True)
    Consumer.objects.filter(public_id="down").update(
        circuit_failures=7, circuit_open_until=timezone.now() + timedelta(minutes=5)
    )

    text = admin_client.get("/metrics").content.decode()

    assert 'broker_consumer_paused{channel="orders",consumer="paused"} 1.0' in text
    assert 'broker_consumer_paused{channel="orders",consumer="down"} 0.0' in text
    assert 'broker_consumer_circuit_open{channel="orders",consumer="down"} 1.0' in text
    assert 'broker_consumer_circuit_open{channel="orders",consumer="paused"} 0.0' in text
    assert 'broker_consumer_consecutive_failures{channel="orders",consumer="down"} 7.0' in text


def test_webhook_brokers_gauges_are_there_under_its_names_and_labels(admin_client):
    from tests.helpers import make_channel, make_consumer

    for status in (QUEUED, QUEUED, INFLIGHT, DEAD, DEAD):
        make_job(status)
    make_consumer(make_channel("audit", token="t"), "archive")  # no jobs at all

    text = admin_client.get("/metrics").content.decode()

    assert "# TYPE queued_job_count gauge" in text
    assert "\nqueued_job_count 2.0\n" in text
    assert "# TYPE dead_job_count gauge" in text
    assert 'dead_job_count{channel="orders",consumer="billing"} 2.0' in text
    assert 'dead_job_count{channel="audit",consumer="archive"} 0.0' in text
