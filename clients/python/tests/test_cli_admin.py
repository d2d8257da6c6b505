"""The management commands against the live broker: channels, producers, consumers, status,
seed load."""

from __future__ import annotations

from pathlib import Path

from tests.cli_helpers import invoke, invoke_json, run_process
from tests.conftest import Broker, unique


def test_channel_put_shows_the_token_once_then_get_and_list(broker: Broker) -> None:
    channel = unique("ch")
    made = invoke_json(broker, "channels", "put", channel, "--name", "Orders")
    assert made["ID"] == channel
    assert made["Token"]
    shown = invoke_json(broker, "channels", "get", channel)
    assert shown["Name"] == "Orders"
    assert "Token" not in shown
    listed = invoke_json(broker, "channels", "list", "--limit", "0")
    assert channel in [item["ID"] for item in listed]


def test_tables_by_default(broker: Broker) -> None:
    channel = unique("ch")
    result = invoke(broker, "channels", "put", channel, "--token", "given-token")
    assert result.exit_code == 0, result.output
    assert channel in result.stdout
    assert "given-token" in result.stdout
    assert "shown only now" in result.stderr
    # No token set by these: no note.
    for args in (("channels", "put", channel, "--name", "Renamed"), ("channels", "get", channel)):
        result = invoke(broker, *args)
        assert result.exit_code == 0, result.output
        assert "shown only now" not in result.stderr
        assert "Token" not in result.stdout


def test_json_after_the_command_name_too(broker: Broker) -> None:
    result = invoke(broker, "channels", "list", "--json", "--limit", "1")
    assert result.exit_code == 0, result.output
    assert isinstance(__import__("json").loads(result.stdout), list)


def test_a_missing_channel_exits_1(broker: Broker) -> None:
    result = run_process(broker, "channels", "get", unique("missing"))
    assert result.returncode == 1
    assert "HTTP 404" in result.stderr
    assert result.stdout == ""


def test_producer_put_with_channels(broker: Broker) -> None:
    channel, producer = unique("ch"), unique("pr")
    invoke_json(broker, "channels", "put", channel)
    made = invoke_json(broker, "producers", "put", producer, "--channels", channel)
    assert made["Channels"] == [channel]
    assert made["Token"]
    assert invoke_json(broker, "producers", "get", producer)["Channels"] == [channel]
    assert producer in [p["ID"] for p in invoke_json(broker, "producers", "list", "--limit", "0")]


def test_consumer_put_takes_every_field(broker: Broker) -> None:
    channel, consumer = unique("ch"), unique("co")
    invoke_json(broker, "channels", "put", channel)
    made = invoke_json(
        broker,
        "consumers",
        "put",
        channel,
        consumer,
        "--callback-url",
        "http://127.0.0.1:9/hook",
        "--type",
        "pull",
        "--token",
        "kt",
        "--name",
        "Warehouse",
        "--ordering",
        "ordered",
        "--retry-delays",
        "1,2,3",
        "--non-retryable-statuses",
        "400,422",
        "--max-in-flight",
        "5",
        "--max-job-age",
        "60",
        "--max-per-second",
        "2.5",
        "--event-types",
        "order.*,invoice.paid",
    )
    assert made["Type"] == "pull"
    assert made["Name"] == "Warehouse"
    assert made["Ordering"] == "ordered"
    assert made["RetryDelays"] == [1, 2, 3]
    assert made["NonRetryableStatuses"] == [400, 422]
    assert (made["MaxInFlight"], made["MaxJobAge"], made["MaxPerSecond"]) == (5, 60, 2.5)
    assert made["EventTypes"] == ["order.*", "invoice.paid"]
    # Blank sets a field back to the broker's default; an option left out keeps its value.
    changed = invoke_json(broker, "consumers", "put", channel, consumer, "--max-in-flight", "")
    assert changed["MaxInFlight"] is None
    assert changed["RetryDelays"] == [1, 2, 3]
    listed = invoke_json(broker, "consumers", "list", channel)
    assert [item["ID"] for item in listed] == [consumer]


def test_consumer_pause_resume_and_secret(broker: Broker) -> None:
    channel, consumer = unique("ch"), unique("co")
    invoke_json(broker, "channels", "put", channel)
    url = "http://127.0.0.1:9/hook"
    invoke_json(broker, "consumers", "put", channel, consumer, "--callback-url", url)
    assert invoke_json(broker, "consumers", "pause", channel, consumer)["Paused"] is True
    assert invoke_json(broker, "consumers", "get", channel, consumer)["Paused"] is True
    assert invoke_json(broker, "consumers", "resume", channel, consumer)["Paused"] is False
    secret = invoke(broker, "consumers", "secret", channel, consumer)
    assert secret.exit_code == 0
    assert secret.stdout.strip().startswith("whsec_")


def test_a_bad_option_value_is_a_usage_error(broker: Broker) -> None:
    result = invoke(broker, "consumers", "put", "c", "k", "--retry-delays", "1,x")
    assert result.exit_code == 2
    assert "--retry-delays" in result.stderr


def test_a_refused_consumer_exits_1(broker: Broker) -> None:
    channel = unique("ch")
    invoke_json(broker, "channels", "put", channel)
    args = ("consumers", "put", channel, unique("co"), "--callback-url", "not a url")
    result = run_process(broker, *args)
    assert result.returncode == 1
    assert "HTTP 400" in result.stderr


def test_status_shows_health_jobs_and_dispatchers(broker: Broker) -> None:
    report = invoke_json(broker, "status")
    assert report["broker"]["status"] == "ok"
    assert isinstance(report["jobs"], list)
    # The session broker runs one dispatcher, which beats every second.
    assert len(report["dispatchers"]) >= 1
    assert report["dispatchers"][0]["lastBeatSecondsAgo"] is not None
    table = invoke(broker, "status")
    assert table.exit_code == 0
    assert "dispatchers" in table.stdout


def test_seed_load_creates_then_updates_and_prints_generated_tokens(
    broker: Broker, tmp_path: Path
) -> None:
    channel, producer, push, pull = unique("ch"), unique("pr"), unique("push"), unique("pull")
    seed = tmp_path / "seed.cfg"
    seed.write_text(
        f"""
[rdbms]
dialect = postgres

[initial-channels]
{channel} = Seeded channel

[initial-channel-tokens]
{channel} = seeded-channel-token

[initial-producers]
{producer} = Seeded producer

[initial-producer-channels]
{producer} = {channel}

[initial-consumers]
{push} = http://127.0.0.1:9/hook
{pull} = http://127.0.0.1:9/unused

[{push}]
channel = {channel}
eventTypes = order.*
maxPerSecond = 3

[{pull}]
channel = {channel}
type = pull
token = seeded-pull-token
"""
    )
    loaded = invoke_json(broker, "seed", "load", str(seed))
    assert f"channel {channel}: created" in loaded
    assert not [line for line in loaded if line.startswith(f"channel {channel}: token")]  # given
    assert [line for line in loaded if line.startswith(f"producer {producer}: token ")]
    assert [line for line in loaded if line.startswith(f"consumer {channel}/{push}: token ")]
    assert not [line for line in loaded if line.startswith(f"consumer {channel}/{pull}: token")]
    consumer = invoke_json(broker, "consumers", "get", channel, push)
    assert consumer["EventTypes"] == ["order.*"]
    assert consumer["MaxPerSecond"] == 3
    assert invoke_json(broker, "consumers", "get", channel, pull)["Type"] == "pull"
    assert invoke_json(broker, "producers", "get", producer)["Channels"] == [channel]
    shown = invoke(broker, "seed", "load", str(seed))  # again, for people: nothing changes
    assert shown.exit_code == 0, shown.output
    assert f"consumer {channel}/{push}: unchanged" in shown.stdout
    assert ": token " not in shown.stdout  # tokens kept, nothing generated


def test_seed_load_refuses_a_bad_file_before_sending_anything(
    broker: Broker, tmp_path: Path
) -> None:
    channel = unique("ch")
    seed = tmp_path / "seed.cfg"
    seed.write_text(
        f"[initial-channels]\n{channel} = c\n[initial-consumers]\nk = http://127.0.0.1:9/\n"
    )
    result = run_process(broker, "seed", "load", str(seed))
    assert result.returncode == 1  # refused by the broker, whole
    assert "[initial-consumers] k: no [k] section" in result.stderr
    assert "nothing was loaded" in result.stderr
    assert run_process(broker, "channels", "get", channel).returncode == 1
