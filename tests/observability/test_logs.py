"""Logs (issue 16): BROKER_LOG_FORMAT, a line per delivery outcome, a line per HTTP request
(docs/observability.md)."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import subprocess
import sys
from datetime import datetime, timedelta
from typing import Any

import pytest

from broker import publish
from broker.logs import TEXT_FORMAT, json_formatter, logging_config
from broker.models import Message
from broker.settings_catalog import ConfigError, ServerEnvironment
from jobs.models import Job
from jobs.states import DELIVERED, INFLIGHT
from tests import ROOT
from tests.api_server import running_api
from tests.delivery import push_consumer, run_once, send
from tests.helpers import make_channel, make_consumer_with_token, make_producer
from tests.processes import (
    NEVER_CONNECTED,
    kill_if_running,
    run_manage,
    start_dispatcher,
    stop,
    wait_until,
)
from tests.receiver import Reply

pytestmark = pytest.mark.django_db

DELIVERY_FIELDS = {
    "job_id",
    "message_id",
    "channel",
    "consumer",
    "consumer_type",
    "attempt",
    "outcome",
    "status_code",
    "error_class",
    "duration_ms",
}
ACCESS_FIELDS = {"method", "path", "status", "duration_ms", "request_id", "remote_addr"}


@pytest.fixture(autouse=True)
def quick_retries(settings):
    settings.BROKER_RETRY_JITTER = 0
    settings.BROKER_RETRY_DELAYS = [60]
    settings.BROKER_DELIVERY_TIMEOUT_SECONDS = 2


@pytest.fixture
def deliveries(caplog):
    caplog.set_level(logging.INFO, logger="broker.deliveries")
    return lambda: [r for r in caplog.records if r.name == "broker.deliveries"]


@pytest.fixture
def access(caplog):
    caplog.set_level(logging.INFO, logger="broker.access")
    return lambda: [r for r in caplog.records if r.name == "broker.access"]


def as_json(record: logging.LogRecord) -> dict[str, Any]:
    line: dict[str, Any] = json.loads(json_formatter().format(record))
    return line


# --- the format ----------------------------------------------------------------------------------


def test_the_log_format_is_text_or_json():
    log_format = ServerEnvironment.BROKER_LOG_FORMAT

    assert log_format.from_environment({"BROKER_LOG_FORMAT": " JSON "}) == "json"
    assert log_format.from_environment({}) == "text"
    with pytest.raises(ConfigError, match="BROKER_LOG_FORMAT='xml' is not one of"):
        log_format.from_environment({"BROKER_LOG_FORMAT": "xml"})


def test_a_bad_log_format_stops_the_process_naming_the_variable():
    result = run_manage("check", BROKER_LOG_FORMAT="xml")

    assert result.returncode != 0
    assert "BROKER_LOG_FORMAT='xml' is not one of text, json" in result.stderr


def test_json_lines_carry_the_extra_fields_as_keys():
    config = logging_config("json", "INFO")
    handler = config["handlers"]["console"]
    assert config["formatters"]["broker"] == {"()": "broker.logs.json_formatter"}
    assert handler["formatter"] == "broker"
    record = logging.LogRecord("broker.x", logging.WARNING, __file__, 1, "went %s", ("dead",), None)
    record.job_id, record.status_code = "cv1", None

    line = as_json(record)

    assert line["message"] == "went dead"
    assert (line["level"], line["logger"]) == ("WARNING", "broker.x")
    assert (line["job_id"], line["status_code"]) == ("cv1", None)
    assert datetime.fromisoformat(line["timestamp"]).utcoffset() == timedelta(0)


def test_text_lines_keep_the_format_they_had():
    assert logging_config("text", "DEBUG")["formatters"]["broker"] == {"format": TEXT_FORMAT}
    assert logging_config("text", "DEBUG")["root"]["level"] == "DEBUG"


# --- a line per delivery outcome ---------------------------------------------------------------


def test_a_delivered_attempt_logs_one_info_line_with_its_fields(
    channel, receiver, dispatcher, deliveries
):
    push_consumer(channel, receiver)
    publish(channel, b"x", producer="shop", message_id="order-1")

    run_once(dispatcher)

    [line] = deliveries()
    job = Job.objects.get()
    assert line.levelno == logging.INFO
    assert {name: getattr(line, name) for name in DELIVERY_FIELDS} == {
        "job_id": job.public_id,
        "message_id": "order-1",
        "channel": "orders",
        "consumer": "billing",
        "consumer_type": "push",
        "attempt": 1,
        "outcome": "delivered",
        "status_code": 200,
        "error_class": "",
        "duration_ms": line.duration_ms,
    }
    assert line.duration_ms > 0
    assert line.getMessage() == (
        f"delivery job_id={job.public_id} message_id=order-1 channel=orders consumer=billing "
        f"consumer_type=push attempt=1 outcome=delivered status_code=200 error_class= "
        f"duration_ms={line.duration_ms}"
    )
    assert as_json(line).keys() >= DELIVERY_FIELDS


def test_a_retried_attempt_says_when_and_why(channel, receiver, dispatcher, deliveries):
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(503)
    publish(channel, b"x", producer="shop")

    run_once(dispatcher)

    [line] = deliveries()
    job = Job.objects.get()
    assert line.levelno == logging.INFO
    assert (line.outcome, line.status_code, line.error_class) == ("retry", 503, "http-status")
    assert line.reason == "HTTP 503"
    assert datetime.fromisoformat(line.retry_at) == job.next_attempt_at
    assert line.getMessage().endswith("reason=HTTP 503")


def test_a_job_going_dead_logs_a_warning_with_its_reason(channel, receiver, dispatcher, deliveries):
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(410)
    publish(channel, b"x", producer="shop")

    run_once(dispatcher)

    [line] = deliveries()
    assert line.levelno == logging.WARNING
    assert (line.outcome, line.status_code) == ("dead", 410)
    assert line.reason == Job.objects.get().last_error == "HTTP 410 Gone: consumer paused"
    assert as_json(line)["reason"] == line.reason


def test_the_last_attempt_s_line_is_a_warning(channel, receiver, dispatcher, deliveries, settings):
    settings.BROKER_RETRY_DELAYS = []  # one attempt
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(500)
    publish(channel, b"x", producer="shop")

    run_once(dispatcher)

    [line] = deliveries()
    assert (line.levelno, line.outcome, line.attempt) == (logging.WARNING, "dead", 1)
    assert line.reason == "HTTP 500; all 1 attempts used"


def test_an_attempt_without_an_answer_has_no_status(channel, dispatcher, deliveries):
    consumer = push_consumer(channel, receiver=_Nowhere())
    publish(channel, b"x", producer="shop")

    run_once(dispatcher)

    [line] = deliveries()
    assert (line.status_code, line.error_class, line.outcome) == (None, "connection", "retry")
    assert "status_code=- " in line.getMessage()
    assert as_json(line)["status_code"] is None
    assert consumer.callback_url not in line.getMessage()


class _Nowhere:
    """A callback on loopback's discard port: refused at once."""

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:9{path}"


def test_a_message_s_trace_id_is_on_its_lines(channel, receiver, dispatcher, deliveries):
    push_consumer(channel, receiver)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    publish(channel, b"x", producer="shop", traceparent=f"00-{trace_id}-00f067aa0ba902b7-01")

    run_once(dispatcher)

    assert deliveries()[0].trace_id == trace_id


def test_each_recorded_attempt_logs_once_when_a_batch_is_recorded_again_one_by_one(
    channel, receiver, dispatcher, deliveries
):
    """A batch the database refuses is recorded again one result at a time: each attempt that
    gets recorded logs one line, and the one that cannot be recorded logs none."""
    push_consumer(channel, receiver)
    for number in range(4):
        publish(channel, b"x", producer="shop", message_id=f"m{number}")
    results = send(dispatcher.claim(10))
    poisoned = dataclasses.replace(results[0], status_code=500, response_excerpt="\x00")

    dispatcher.complete([poisoned, *results[1:]])

    assert Job.objects.get(pk=poisoned.job_id).status == INFLIGHT
    logged = sorted(line.message_id for line in deliveries())
    recorded = Job.objects.filter(status=DELIVERED).values_list("message__public_id", flat=True)
    assert logged == sorted(recorded)
    assert len(logged) == 3


# --- pull consumers' reports ---------------------------------------------------------------------


def test_a_pull_consumer_s_reports_are_outcomes_too(client, channel, deliveries):
    make_consumer_with_token(channel)
    for number in range(2):
        publish(channel, b"x", producer="shop", message_id=f"m{number}")
    headers = {
        "X-Broker-Channel-Token": "channel-token",
        "X-Broker-Consumer-Token": "consumer-token",
    }
    base = "/channel/orders/consumer/worker"
    claimed = client.post(f"{base}/claim", "limit=2", content_type=FORM, headers=headers)
    first, second = (job["ID"] for job in claimed.json()["Result"])

    for job_id, state in [(first, "DELIVERED"), (second, "DEAD"), (second, "DEAD")]:
        moved = client.post(
            f"{base}/job/{job_id}", {"NextState": state}, "application/json", headers=headers
        )
        assert moved.status_code == 202

    delivered, dead = deliveries()  # the repeated report moved nothing and logs nothing
    assert (delivered.levelno, delivered.outcome, delivered.job_id) == (
        logging.INFO,
        "delivered",
        first,
    )
    assert (dead.levelno, dead.outcome, dead.job_id) == (logging.WARNING, "dead", second)
    assert dead.reason == "reported failed by the pull consumer"
    for line in (delivered, dead):
        assert (line.consumer_type, line.consumer, line.channel, line.attempt) == (
            "pull",
            "worker",
            "orders",
            1,
        )
        assert line.status_code is None
        assert line.duration_ms >= 0  # how long the worker held the job
    assert {delivered.message_id, dead.message_id} == {"m0", "m1"}


FORM = "application/x-www-form-urlencoded"


# --- a line per HTTP request ---------------------------------------------------------------------


def test_each_request_logs_one_access_line(admin_client, access):
    response = admin_client.get("/channels?limit=5&token=never-logged")

    [line] = access()
    assert line.levelno == logging.INFO
    assert {name: getattr(line, name) for name in ACCESS_FIELDS} == {
        "method": "GET",
        "path": "/channels",
        "status": 200,
        "duration_ms": line.duration_ms,
        "request_id": response["X-Request-ID"],
        "remote_addr": "127.0.0.1",
    }
    assert "never-logged" not in line.getMessage()
    assert line.getMessage() == (
        f"access method=GET path=/channels status=200 duration_ms={line.duration_ms} "
        f"request_id={response['X-Request-ID']} remote_addr=127.0.0.1"
    )
    assert as_json(line).keys() >= ACCESS_FIELDS


def test_refusals_and_unknown_paths_are_logged_with_their_status(client, access):
    client.get("/channels", headers={"Authorization": "Bearer wrong"})
    client.get("/no-such-page")
    client.post("/channel/orders/broadcast", b"x", content_type="text/plain")

    assert [(line.method, line.path, line.status) for line in access()] == [
        ("GET", "/channels", 401),
        ("GET", "/no-such-page", 404),
        ("POST", "/channel/orders/broadcast", 404),
    ]


def test_a_proxy_s_request_id_is_the_line_s(client, access):
    client.get("/_status", headers={"X-Request-ID": "proxy-req-7"})

    assert access()[0].request_id == "proxy-req-7"


def test_a_path_cannot_forge_a_line(client, access):
    client.get("/x%0A2026-01-01 INFO broker.access forged%0D")

    [line] = access()
    assert line.path == "/x%0A2026-01-01%20INFO%20broker.access%20forged%0D"
    assert "\n" not in line.getMessage()
    assert "\r" not in line.getMessage()


# --- the processes -------------------------------------------------------------------------------


def json_lines(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


@pytest.mark.django_db(transaction=True)
def test_the_web_process_logs_one_json_access_line_per_request_and_gunicorn_none():
    with running_api(BROKER_LOG_FORMAT="json") as server:
        answer = server.request("GET", "/channels?token=in-the-query")
        output = server.output()

    assert answer.status == 401
    lines = [line for line in json_lines(output) if line.get("path") == "/channels"]
    assert len(lines) == 1  # ours; gunicorn's own access log is off
    [line] = lines
    assert line["logger"] == "broker.access"
    assert (line["method"], line["status"], line["request_id"]) == (
        "GET",
        401,
        answer.headers["X-Request-ID"],
    )
    assert "in-the-query" not in output
    # Every line about the request is JSON (ours, and Django's "Unauthorized: /channels").
    about_it = [text for text in output.splitlines() if "/channels" in text]
    assert about_it
    assert all(text.startswith("{") for text in about_it)


@pytest.mark.django_db(transaction=True)
def test_a_dispatcher_process_logs_json_lines(receiver):
    make_producer()
    channel = make_channel()
    push_consumer(channel, receiver)
    publish(channel, b"x", producer="shop", message_id="by-the-process")
    process = start_dispatcher(BROKER_LOG_FORMAT="json", DJANGO_LOG_LEVEL="INFO")
    try:
        wait_until(lambda: Job.objects.filter(status=DELIVERED).exists(), seconds=60)
        output = stop(process)
    finally:
        kill_if_running(process)

    [line] = [line for line in json_lines(output) if line["logger"] == "broker.deliveries"]
    assert (line["message_id"], line["outcome"], line["status_code"]) == (
        "by-the-process",
        "delivered",
        200,
    )
    assert line["job_id"] == Job.objects.get().public_id
    assert Message.objects.get().public_id == "by-the-process"


def test_python_json_logger_is_only_loaded_for_json():
    code = (
        "import sys, django; django.setup()\n"
        "import logging; logging.getLogger('x').info('hello')\n"
        "print('pythonjsonlogger' in sys.modules)\n"
    )
    environment = {**os.environ, "DATABASE_URL": NEVER_CONNECTED}
    environment["DJANGO_SETTINGS_MODULE"] = "broker.settings"
    for log_format, loaded in [("text", "False"), ("json", "True")]:
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**environment, "BROKER_LOG_FORMAT": log_format},
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.stdout.strip() == loaded, result.stderr
    assert json.loads(io.StringIO(result.stderr).readline())["message"] == "hello"
