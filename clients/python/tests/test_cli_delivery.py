"""Publishing and following delivery with the command line: messages get, pull, dlq, tail."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.cli_helpers import (
    Receiver,
    command,
    invoke,
    invoke_json,
    process_env,
    run_process,
    wait_for,
)
from tests.conftest import Broker, unique


@dataclass(frozen=True)
class Setup:
    """A channel and producer made with the command line, with their tokens in the env."""

    channel: str
    env: dict[str, str]


@pytest.fixture
def setup(broker: Broker) -> Setup:
    channel, producer = unique("ch"), unique("pr")
    channel_token = invoke_json(broker, "channels", "put", channel)["Token"]
    producer_token = invoke_json(broker, "producers", "put", producer)["Token"]
    env = {
        "WEBHOOK_BROKER_CHANNEL_TOKEN": channel_token,
        "WEBHOOK_BROKER_PRODUCER_ID": producer,
        "WEBHOOK_BROKER_PRODUCER_TOKEN": producer_token,
    }
    return Setup(channel, env)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver().running() as running:
        yield running


def publish(broker: Broker, setup: Setup, message_id: str, data: str = "{}") -> None:
    result = invoke(broker, "publish", setup.channel, "--id", message_id, "-d", data, env=setup.env)
    assert result.exit_code == 0, result.output


def job_status(broker: Broker, channel: str, message_id: str, consumer: str) -> str:
    message = invoke_json(broker, "messages", "get", channel, message_id)
    return str(next(job["Status"] for job in message["Jobs"] if job["ListenerName"] == consumer))


def add_consumer(broker: Broker, channel: str, consumer: str, *options: str) -> Any:
    return invoke_json(broker, "consumers", "put", channel, consumer, *options)


def test_messages_get_shows_each_consumer_s_job(
    broker: Broker, setup: Setup, receiver: Receiver
) -> None:
    add_consumer(broker, setup.channel, "billing", "--callback-url", receiver.url)
    pull_options = ("--callback-url", "http://127.0.0.1:9/unused", "--type", "pull")
    add_consumer(broker, setup.channel, "warehouse", *pull_options)
    publish(broker, setup, "order-42", '{"order": 42}')
    waited = ("messages", "wait", setup.channel, "order-42", "--consumer", "billing")
    delivered = run_process(broker, "--json", *waited, "--status", "DELIVERED")
    assert delivered.returncode == 0, delivered.stderr
    billing = [
        job for job in json.loads(delivered.stdout)["Jobs"] if job["ListenerName"] == "billing"
    ]
    assert [job["Status"] for job in billing] == ["DELIVERED"]
    assert billing[0]["LastAttempt"]["StatusCode"] == 200  # what the receiver answered
    assert receiver.bodies == [b'{"order": 42}']
    # A state the job never reaches: exit 1 once --timeout is over, saying what was awaited.
    never = run_process(broker, *waited, "--status", "DEAD", "--timeout", "1")
    assert never.returncode == 1
    assert "gave up after 1 s: billing's job for order-42 is not DEAD" in never.stderr
    assert "DELIVERED" in never.stdout  # the message with its jobs, to see why
    shown = invoke(broker, "messages", "get", setup.channel, "order-42")
    assert shown.exit_code == 0
    for text in ("order-42", "billing", "warehouse", "DELIVERED", "QUEUED"):
        assert text in shown.stdout
    assert invoke_json(broker, "messages", "list", setup.channel) == ["order-42"]


def test_pull_claims_and_acknowledges(broker: Broker, setup: Setup) -> None:
    options = ("--callback-url", "http://127.0.0.1:9/unused", "--type", "pull", "--token", "wt")
    add_consumer(broker, setup.channel, "warehouse", *options)
    publish(broker, setup, "order-7", "seven")
    tokens = {**setup.env, "WEBHOOK_BROKER_CONSUMER_TOKEN": "wt"}
    result = run_process(broker, "--json", "pull", setup.channel, "warehouse", "--ack", **tokens)
    assert result.returncode == 0, result.stderr
    pulled = json.loads(result.stdout)
    assert [job["Message"]["MessageID"] for job in pulled["Result"]] == ["order-7"]
    assert pulled["Result"][0]["Message"]["Payload"] == "seven"
    assert [item["Status"] for item in pulled["Report"]] == [202]
    assert job_status(broker, setup.channel, "order-7", "warehouse") == "DELIVERED"
    empty = invoke(broker, "pull", setup.channel, "warehouse", env=tokens)
    assert empty.stdout.strip() == "no jobs"


def test_pull_with_a_wrong_token_exits_1(broker: Broker, setup: Setup) -> None:
    options = ("--callback-url", "http://127.0.0.1:9/unused", "--type", "pull")
    add_consumer(broker, setup.channel, "warehouse", *options)
    args = ("pull", setup.channel, "warehouse", "--consumer-token", "wrong")
    result = run_process(broker, *args, **setup.env)
    assert result.returncode == 1
    assert "HTTP 403" in result.stderr


def _dead_jobs(broker: Broker, channel: str, consumer: str) -> list[Any]:
    jobs: list[Any] = invoke_json(broker, "dlq", "list", channel, consumer)
    return jobs


def test_dlq_requeue_and_purge_ask_first(broker: Broker, setup: Setup) -> None:
    with Receiver(status=400).running() as refusing:
        options = ("--callback-url", refusing.url, "--non-retryable-statuses", "400")
        add_consumer(broker, setup.channel, "billing", *options, "--token", "kt")
        publish(broker, setup, "m-1")
        publish(broker, setup, "m-2")
        both_dead = lambda: len(_dead_jobs(broker, setup.channel, "billing")) == 2  # noqa: E731
        wait_for(both_dead, "two dead jobs")
        listed = invoke(broker, "dlq", "list", setup.channel, "billing")
        assert "m-1" in listed.stdout
        assert "m-2" in listed.stdout

        # No terminal to answer on: the answer is no, and nothing changes.
        refused = run_process(broker, "dlq", "requeue", setup.channel, "billing")
        assert refused.returncode == 1
        assert "Requeue 2 dead job(s)" in refused.stderr
        assert "Nothing done" in refused.stderr
        answered_no = invoke(broker, "dlq", "requeue", setup.channel, "billing", input="n\n")
        assert answered_no.exit_code == 1
        assert len(_dead_jobs(broker, setup.channel, "billing")) == 2

        accepted = invoke(broker, "dlq", "requeue", setup.channel, "billing", input="y\n")
        assert accepted.exit_code == 0, accepted.output
        assert "requeued 2 dead job(s)" in accepted.stdout
        wait_for(both_dead, "the requeued jobs dead again")

    # As the admin: no consumer's tokens needed (with them, Admin.purge_dlq's tests).
    purged = run_process(broker, "--json", "dlq", "purge", setup.channel, "billing", "--yes")
    assert purged.returncode == 0, purged.stderr
    assert json.loads(purged.stdout) == {"count": 2, "action": None}
    assert _dead_jobs(broker, setup.channel, "billing") == []


def _read_lines(stream: Any, into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def test_tail_follows_messages_and_outcomes_until_ctrl_c(
    broker: Broker, setup: Setup, receiver: Receiver
) -> None:
    add_consumer(broker, setup.channel, "billing", "--callback-url", receiver.url)
    args = command("--json", "tail", setup.channel, "--interval", "0.2")
    tail = subprocess.Popen(
        args,
        env=process_env(broker),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as in a terminal, even when this test runs in a background job (which ignores
        # SIGINT, and Python then keeps ignoring it in the process it starts).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert tail.stderr is not None
        assert "following" in tail.stderr.readline()  # it knows the channel's messages now
        publish(broker, setup, "first")
        publish(broker, setup, "second")
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_read_lines, args=(tail.stdout, lines), daemon=True).start()
        events: list[dict[str, Any]] = []

        def delivered_both() -> bool:
            while not lines.empty():
                events.append(json.loads(lines.get()))
            delivered = {
                e["messageId"] for e in events if e["event"] == "job" and e["status"] == "DELIVERED"
            }
            return delivered == {"first", "second"}

        wait_for(delivered_both, "tail to show both messages DELIVERED")
        published = [e["messageId"] for e in events if e["event"] == "message"]
        assert published == ["first", "second"]
        assert all(e["consumer"] == "billing" for e in events if e["event"] == "job")
    finally:
        tail.send_signal(signal.SIGINT)
        assert tail.wait(timeout=60) == 0
