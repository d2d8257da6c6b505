"""`manage.py runbroker` (the README's run command) and the README's quick start, as a user runs
them: real processes in a directory of their own, without DATABASE_URL: on the embedded PostgreSQL
server that runbroker starts in postgres/ there, and stops last."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests import ROOT
from tests.clock import skip_if_moved
from tests.embedded_database import delete_embedded_server
from tests.processes import free_port, group_is_running, kill_if_running, wait_until

README = ROOT / "README.md"


def readme_block(marker: str) -> str:
    """The ```sh block that follows `<!-- marker -->` in the README (what .ci/run reads too)."""
    text = README.read_text()
    after = text[text.index(f"<!-- {marker} -->") :]
    return after.split("```sh\n", 1)[1].split("\n```", 1)[0]


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.fixture
def clone(tmp_path):
    """A directory that looks like a clone with its venv: the broker's files, written to here."""
    skip_if_moved()  # the broker's processes run on the real clock
    (tmp_path / ".venv").symlink_to(sys.prefix)
    for name in ("manage.py", "docs", "clients"):
        (tmp_path / name).symlink_to(ROOT / name)
    yield tmp_path
    delete_embedded_server(tmp_path / "postgres")  # left running if a test killed runbroker


def start_runbroker(
    clone: Path, *arguments: str, log_name: str = "runbroker.log"
) -> tuple[subprocess.Popen[str], Path]:
    log = clone / log_name
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("BROKER_", "DATABASE_", "DJANGO_"))
    }
    process = subprocess.Popen(
        [".venv/bin/python", "manage.py", "runbroker", *arguments],
        cwd=clone,
        env={**environment, "BROKER_ALLOW_PRIVATE_CALLBACKS": "true", "PYTHONUNBUFFERED": "1"},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    return process, log


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (127.0.0.1)
            return bool(json.load(response)["status"] == "ok")
    except (OSError, urllib.error.URLError, ValueError):
        return False


def pids_of(log: Path) -> dict[str, int]:
    return {
        name: int(pid) for name, pid in re.findall(r"started (\S+) \(pid (\d+)\)", log.read_text())
    }


def call_api(
    port: int, method: str, path: str, admin_token: str, **fields: str
) -> dict[str, object]:
    data = "&".join(f"{key}={value}" for key, value in fields.items()).encode() or None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {admin_token}")
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        body = response.read()
    return json.loads(body) if body else {}


class TestRunbroker:
    def test_one_command_runs_web_dispatcher_and_housekeeping_and_sigterm_stops_them(
        self, clone, receiver
    ):
        port = free_port()
        process, log = start_runbroker(clone, "--bind", f"127.0.0.1:{port}")
        try:
            wait_until(lambda: answers(f"http://127.0.0.1:{port}/_status"), seconds=120)
            output = log.read_text()
            for path in ("/api/docs/", "/ui/", "/admin/", "/_status"):
                assert f"http://127.0.0.1:{port}{path}" in output
            token_file = clone / ".broker-admin-token"
            token = token_file.read_text().strip()
            assert f"Bearer token: {token}" in output
            assert token_file.stat().st_mode & 0o077 == 0  # its owner's only
            assert set(pids_of(log)) == {"web", "dispatch", "housekeeping"}
            assert "Database   PostgreSQL on 127.0.0.1:" in output
            assert (clone / "postgres" / "PG_VERSION").exists()

            # The dispatcher runs: a broadcast reaches the receiver.
            call_api(port, "PUT", "/channel/c", token, token="ct")
            call_api(port, "PUT", "/producer/p", token, token="pt")
            call_api(
                port, "PUT", "/channel/c/consumer/k", token, token="kt", callbackUrl=receiver.url()
            )
            broadcast = urllib.request.Request(
                f"http://127.0.0.1:{port}/channel/c/broadcast",
                data=b'{"hello": 1}',
                headers={
                    "X-Broker-Channel-Token": "ct",
                    "X-Broker-Producer-ID": "p",
                    "X-Broker-Producer-Token": "pt",
                    "Content-Type": "application/json",
                },
            )
            urllib.request.urlopen(broadcast, timeout=10).close()  # noqa: S310
            wait_until(lambda: receiver.received, seconds=60)
            assert receiver.received[0].body == b'{"hello": 1}'
            # Housekeeping runs: django-q2's cluster said so.
            wait_until(lambda: "running." in log.read_text(), seconds=60)

            pids = pids_of(log)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
            assert not [name for name, pid in pids.items() if group_is_running(pid)]
            for name in pids:
                assert f"{name} stopped (exit code 0)" in log.read_text()
            # The embedded server stopped too, after them.
            assert not (clone / "postgres" / "postmaster.pid").exists()
        finally:
            kill_if_running(process)

    def test_a_second_run_does_not_make_another_token(self, clone):
        port = free_port()
        for run in range(2):
            process, log = start_runbroker(
                clone, "--bind", f"127.0.0.1:{port}", "--dispatchers", "0", "--no-housekeeping"
            )
            try:
                wait_until(lambda: answers(f"http://127.0.0.1:{port}/_status"), seconds=120)
                token = (clone / ".broker-admin-token").read_text().strip()
                shown = token in log.read_text()
                assert shown if run == 0 else not shown
                assert "Bearer token: in " in log.read_text() or run == 0
                if run == 0:  # a second runbroker in the same directory stops at once
                    second, second_log = start_runbroker(
                        clone, "--bind", f"127.0.0.1:{free_port()}", log_name="second.log"
                    )
                    assert second.wait(timeout=60) == 1
                    assert "another process" in second_log.read_text()
                    assert answers(f"http://127.0.0.1:{port}/_status")  # the first runs on
                process.send_signal(signal.SIGINT)
                assert process.wait(timeout=60) == 0
            finally:
                kill_if_running(process)

    def test_when_one_process_dies_the_others_are_stopped_and_the_run_fails(self, clone):
        port = free_port()
        process, log = start_runbroker(clone, "--bind", f"127.0.0.1:{port}")
        try:
            wait_until(lambda: answers(f"http://127.0.0.1:{port}/_status"), seconds=120)
            pids = pids_of(log)
            os.kill(pids["dispatch"], signal.SIGKILL)
            assert process.wait(timeout=60) == 1
            assert "dispatch exited with code -9; stopped the others" in log.read_text()
            assert not [name for name, pid in pids.items() if group_is_running(pid)]
        finally:
            kill_if_running(process)


def test_the_readme_quick_start_works_as_written(clone):
    """The README's quick start, pasted into bash next to the README's broker: a verified
    webhook, a pulled and acknowledged job, a dead job, and the requeued job delivered."""
    text = run_beside_the_readme_broker(clone, "quick-start", until='"id": "order-43"')
    assert 'verified webhook {"id": "order-42", "channel": "orders"' in text
    assert re.search(r"acknowledged job [0-9a-v]{20}", text)
    assert '"MessageURL":"/channel/orders/message/order-43"' in text  # the DLQ listing
    assert '{"requeuedCount":1}' in text
    assert "rejected" not in text


@pytest.mark.slow  # it installs the Python client into the venv (a wheel built from clients/)
def test_the_readme_quick_start_with_the_command_line_works_as_written(clone):
    """The same steps with the command line (`webhook-broker`), installed as the block says."""
    text = run_beside_the_readme_broker(clone, "quick-start-cli", until='"id": "order-45"')
    assert 'verified webhook {"id": "order-44", "channel": "orders"' in text
    assert re.search(r"acknowledged job [0-9a-v]{20}", text)
    assert "order-45" in text  # the DLQ listing
    assert "requeued 1 dead job(s)" in text
    assert "rejected" not in text


def run_beside_the_readme_broker(clone: Path, block: str, until: str) -> str:
    """The README's `block` in bash -e next to runbroker on port 8000, as a user pastes it; its
    output once it has exited 0 and `until` (the receiver's last line) has shown."""
    if not (port_is_free(8000) and port_is_free(9000)):
        pytest.fail("the README's quick start uses ports 8000 and 9000, and one is taken")
    run_command = readme_block("run-command").split(" && ")[-1]
    assert run_command == (
        "BROKER_ALLOW_PRIVATE_CALLBACKS=true .venv/bin/python manage.py runbroker"
    )
    process, _ = start_runbroker(clone)  # the same command and environment, as a process
    pasted = None
    try:
        wait_until(lambda: answers("http://127.0.0.1:8000/_status"), seconds=120)
        output = clone / f"{block}.out"
        pasted = subprocess.Popen(
            ["/bin/bash", "-e", "-o", "pipefail", "-c", readme_block(block)],
            cwd=clone,
            stdout=output.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the receiver it leaves running is in its process group
        )
        assert pasted.wait(timeout=300) == 0, output.read_text()
        wait_until(lambda: until in output.read_text(), seconds=60)
        return output.read_text()
    finally:
        if pasted is not None:
            with contextlib.suppress(ProcessLookupError):  # the receiver it left running
                os.killpg(pasted.pid, signal.SIGTERM)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def test_the_token_file_is_written_private_over_a_readable_file_or_a_link(tmp_path):
    from broker.management.commands.runbroker import write_private_file

    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("keep")
    linked = tmp_path / "linked"
    linked.symlink_to(elsewhere)
    write_private_file(linked, "token\n")
    assert elsewhere.read_text() == "keep"  # the link was replaced, not followed
    assert not linked.is_symlink()
    assert linked.read_text() == "token\n"
    assert linked.stat().st_mode & 0o077 == 0

    readable = tmp_path / "readable"
    readable.write_text("old token")
    readable.chmod(0o644)
    write_private_file(readable, "token\n")
    assert readable.stat().st_mode & 0o077 == 0
