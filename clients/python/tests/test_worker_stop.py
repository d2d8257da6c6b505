"""The pull worker's graceful stop: SIGTERM to a worker process in the middle of a batch loses
nothing and attempts nothing twice that had not started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import Broker
from tests.pull_setup import TOKEN, eventually, pull_consumer, running

SOURCE = Path(__file__).resolve().parents[1] / "src"
GRACE_SECONDS = 30  # the Worker's default


# Two handler threads, and one handler run on the worker's own thread (concurrency 1).
@pytest.mark.parametrize(("concurrency", "prefetch"), [(2, 4), (1, 5)])
def test_sigterm_in_the_middle_of_a_batch_loses_nothing(
    broker: Broker, tmp_path: Path, concurrency: int, prefetch: int
) -> None:
    pull = pull_consumer(broker)
    message_ids = pull.publish(20)
    started_file = tmp_path / "started"
    started_file.touch()
    command = [sys.executable, str(Path(__file__).with_name("stop_worker.py"))]
    command += [broker.url, pull.channel, pull.consumer, TOKEN, str(started_file)]
    command += [str(concurrency), str(prefetch)]
    env = {**os.environ, "PYTHONPATH": str(SOURCE)}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def started() -> list[str]:
        return started_file.read_text().split()

    try:
        # 6 claimed (1 or 2 running, the rest held); a stop lets those running finish.
        eventually(lambda: len(started()) >= 3, what="three jobs started")
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        out, err = process.communicate(timeout=GRACE_SECONDS + 30)
        took = time.monotonic() - signalled
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "stopped" in out
    assert took < GRACE_SECONDS, took

    first = started()
    assert len(first) == len(set(first))
    assert 3 <= len(first) <= 6  # a stop never starts what was held
    jobs = pull.jobs(message_ids)
    for message_id in first:
        assert jobs[message_id]["Status"] == "DELIVERED", (message_id, jobs[message_id])
        assert jobs[message_id]["Attempts"] == 1
    rest = [message_id for message_id in message_ids if message_id not in first]
    for message_id in rest:
        assert jobs[message_id]["Status"] == "QUEUED", (message_id, jobs[message_id])
        assert jobs[message_id]["Attempts"] == 0
    assert any("unstarted" in jobs[m]["LastError"] for m in rest), "held jobs given back"

    second: Counter[str] = Counter()
    with running(
        pull.worker(concurrency=2, prefetch=4), lambda job: second.update([job.message_id])
    ):
        eventually(lambda: pull.all_delivered(message_ids))
    assert sorted(second) == rest
    assert set(second.values()) == {1}
    assert {job["Attempts"] for job in pull.jobs(message_ids).values()} == {1}
