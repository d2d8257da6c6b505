"""The command line's contract: configuration, output streams and exit codes (0, 1, 2, 3)."""

from __future__ import annotations

import json
import socket

from tests.cli_helpers import invoke, run_process
from tests.conftest import Broker, Publisher


def _publisher_env(publisher: Publisher) -> dict[str, str]:
    return {
        "WEBHOOK_BROKER_CHANNEL_TOKEN": publisher.channel_token,
        "WEBHOOK_BROKER_PRODUCER_ID": publisher.producer_id,
        "WEBHOOK_BROKER_PRODUCER_TOKEN": publisher.producer_token,
    }


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_help_lists_the_commands() -> None:
    result = run_process(None, "--help")
    assert result.returncode == 0
    for name in ("status", "channels", "consumers", "publish", "dlq", "tail", "seed", "pull"):
        assert name in result.stdout


def test_no_broker_address_is_a_usage_error() -> None:
    result = run_process(None, "channels", "list")
    assert result.returncode == 2
    assert "WEBHOOK_BROKER_URL" in result.stderr
    assert result.stdout == ""


def test_publish_prints_the_message_id(broker: Broker, publisher: Publisher) -> None:
    env = _publisher_env(publisher)
    args = ("publish", publisher.channel_id, "--data", "hello", "--id", "greeting-1")
    result = invoke(broker, *args, env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "greeting-1"


def test_publish_reads_stdin_and_answers_json(broker: Broker, publisher: Publisher) -> None:
    env = _publisher_env(publisher)
    result = run_process(broker, "--json", "publish", publisher.channel_id, input="{}", **env)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["Channel"] == publisher.channel_id
    assert answer["MessageID"]


def test_a_refusal_exits_1_with_the_broker_s_message(broker: Broker, publisher: Publisher) -> None:
    env = {**_publisher_env(publisher), "WEBHOOK_BROKER_PRODUCER_TOKEN": "wrong"}
    result = run_process(broker, "publish", publisher.channel_id, "--data", "x", **env)
    assert result.returncode == 1
    assert "HTTP 403" in result.stderr
    assert result.stdout == ""


def test_flags_override_the_environment(broker: Broker, publisher: Publisher) -> None:
    env = {**_publisher_env(publisher), "WEBHOOK_BROKER_PRODUCER_TOKEN": "wrong"}
    flags = ("--producer-token", publisher.producer_token, "--data", "x")
    result = run_process(broker, "publish", publisher.channel_id, *flags, **env)
    assert result.returncode == 0, result.stderr


def test_an_unreachable_broker_exits_3(broker: Broker) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    result = run_process(broker, "--url", url, "status")
    assert result.returncode == 3
    assert "no answer from the broker" in result.stderr


def test_tail_of_a_missing_channel_exits_1_at_once(broker: Broker) -> None:
    result = run_process(broker, "tail", "no-such-channel")
    assert result.returncode == 1
    assert "HTTP 404" in result.stderr


def test_json_errors_stay_off_stdout(broker: Broker) -> None:
    result = run_process(broker, "--json", "consumers", "get", "no-such-channel", "k")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: HTTP 404")
