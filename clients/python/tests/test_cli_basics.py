"""The command line's contract: configuration, output streams and exit codes (0, 1, 2, 3)."""

from __future__ import annotations

import json
import socket

from tests.cli_helpers import invoke, invoke_json, run_process
from tests.conftest import Broker, Publisher, unique
from tests.flaky_proxy import flaky_proxy


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


def test_publishing_an_id_the_channel_has_says_so(broker: Broker, publisher: Publisher) -> None:
    env = _publisher_env(publisher)
    args = ("publish", publisher.channel_id, "--data", "hello", "--id", "twice")
    first = invoke(broker, *args, env=env)
    assert first.exit_code == 0, first.output
    assert "already existed" not in first.stderr
    again = invoke(broker, *args, env=env)
    assert again.exit_code == 0, again.output  # the message is there: published, as asked
    assert again.stdout.strip() == "twice"
    assert "message ID twice already existed; not published again" in again.stderr


def test_a_409_to_our_own_retry_is_no_note(broker: Broker, publisher: Publisher) -> None:
    """The first try was stored but its answer lost (502): the retry's 409 is our own message."""
    env = _publisher_env(publisher)
    with flaky_proxy(broker.url, ["lose"]) as (url, script):
        args = ("--url", url, "publish", publisher.channel_id, "--data", "x", "--id", "lost-1")
        result = invoke(broker, *args, env=env)
    assert result.exit_code == 0, result.output
    assert len(script.seen) == 2
    assert "already existed" not in result.stderr


def test_the_admin_token_is_admin_token_and_put_token_is_the_resource_s(broker: Broker) -> None:
    channel = unique("ch")
    env = {"WEBHOOK_BROKER_TOKEN": ""}  # hidden: only the flag may give it
    flags = ("--admin-token", broker.admin_token)
    made = invoke_json(broker, *flags, "channels", "put", channel, "--token", "own", env=env)
    assert made["Token"] == "own"
    missing = invoke(broker, "channels", "get", channel, env=env)
    assert missing.exit_code == 2
    assert "--admin-token" in missing.stderr
    old_flag = invoke(broker, "--token", broker.admin_token, "channels", "get", channel, env=env)
    assert old_flag.exit_code == 2  # no global --token any more: never mistaken for the other


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
