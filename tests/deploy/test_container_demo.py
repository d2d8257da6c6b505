"""docs/deploy.md's container block, as written: from a machine with only Docker to a verified
webhook (issue 38).

The ```sh block after `<!-- container-demo -->` runs in bash with `-e`, in a copy of the working
tree (tests/deploy/docker_base.py: what it writes, `.env` and `deploy/pip/ca.crt`, stays out of
the clone). It installs what is missing, starts dockerd if none answers, builds the debootstrap
base when absent, builds the broker's and PostgreSQL's images with whichever builder the docker
CLI has, and ends in `docker-compose --profile demo up`, which runs until stopped. The test reads
that output until the demo's receiver prints the published message as "verified webhook", then
stops the block and removes the project (`down -v`).

The environment adds only what keeps the run apart from others on this machine: a project name
of its own and a free port for the web server (Compose reads both from the shell). The block's
image tags are its own: webhook-broker:latest and broker-postgres:15 are rebuilt here.

Marked `docker`, so the default test command leaves it out: `.venv/bin/pytest -m docker` (root,
a running dockerd; the block installs docker-compose and debootstrap if missing).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time

import pytest

from tests import ROOT
from tests.deploy.docker_base import copy_of_working_tree, run, tool
from tests.faults import report
from tests.processes import free_port

pytestmark = pytest.mark.docker

MARKER = "<!-- container-demo -->"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
BLOCK_SECONDS = 1200  # a new machine: packages, debootstrap, two image builds, the first start
PUBLISHED = {"order": 1, "note": "published by the compose demo"}  # docs/examples/demo_publisher.py


def docs_block(marker: str) -> str:
    """The ```sh block that follows `marker` in docs/deploy.md."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    after = text[text.index(marker) :]
    return after.split("```sh\n", 1)[1].split("\n```", 1)[0]


class Output:
    """The block's output, read by a thread as it comes (the last command never ends)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.process = process
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            # Compose colours each service's prefix, also into a pipe.
            self.lines.append(ANSI_ESCAPE.sub("", line.rstrip("\n")))

    def wait_for(self, pattern: str, seconds: float) -> re.Match[str]:
        """The first line that matches; fails when the block ends or time is up."""
        started = time.monotonic()
        while True:
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match
            if self.process.poll() is not None:
                self.reader.join(timeout=10)
                pytest.fail(f"the block exited {self.process.returncode}:\n{self.tail()}")
            if time.monotonic() - started > seconds:
                pytest.fail(f"no line like {pattern!r} within {seconds} s:\n{self.tail()}")
            time.sleep(1)

    def tail(self, lines: int = 150) -> str:
        return "\n".join(self.lines[-lines:])


def stop(process: subprocess.Popen[str]) -> None:
    """Ctrl-C, as a user stops `docker-compose up`; then the rest of the block's group."""
    for sent in (signal.SIGINT, signal.SIGKILL):
        try:
            os.killpg(process.pid, sent)
            process.wait(timeout=90)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def test_the_deploy_docs_block_ends_in_a_verified_webhook(tmp_path):
    block = docs_block(MARKER)
    assert "docker-compose --profile demo up" in block.splitlines()[-1]
    tree = copy_of_working_tree(tmp_path / "clone")
    environment = {
        **{
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("BROKER_", "DATABASE_", "DJANGO_", "COMPOSE_", "DOCKER_"))
        },
        "COMPOSE_PROJECT_NAME": f"brokerdemo{os.getpid()}{secrets.token_hex(3)}",
        "BROKER_WEB_PORT": str(free_port()),
    }
    started = time.monotonic()
    process = subprocess.Popen(
        [tool("bash"), "-e", "-o", "pipefail", "-c", block],
        cwd=tree,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = Output(process)
    try:
        verified = output.wait_for(
            r"demo-receiver\S*\s*\| verified webhook (\{.*\})$", BLOCK_SECONDS
        )
        verified_seconds = time.monotonic() - started
        webhook = json.loads(verified[1])
        assert webhook["channel"] == "demo"
        assert webhook["consumer"] == "demo-receiver"
        assert json.loads(webhook["body"]) == PUBLISHED
        assert output.wait_for(r"demo-publisher\S*\s*\| demo: published ", 10)
        assert not any(" rejected " in line for line in output.lines), output.tail()
    finally:
        stop(process)
        compose = shutil.which("docker-compose")  # none if the block failed before installing it
        if compose:
            subprocess.run(
                [compose, "--profile", "demo", "down", "-v", "--remove-orphans"],
                cwd=tree,
                env=environment,
                capture_output=True,
                timeout=300,
                check=False,
            )
        print(output.tail())  # shown when the test failed
    assert not project_containers(environment["COMPOSE_PROJECT_NAME"])  # down removed them
    # What pip had from this machine (deploy/pip/) was in the builder stage only.
    history = run(tool("docker"), "history", "--no-trunc", "webhook-broker:latest").stdout
    assert "/pip/" not in history
    assert (tree / "deploy" / "pip" / "ca.crt").exists()  # the block gave pip this machine's CAs
    absent = run(
        tool("docker"), "run", "--rm", "webhook-broker:latest",
        "sh", "-c", "test ! -e /pip && test ! -e /src && echo absent",
    ).stdout  # fmt: skip
    assert absent.strip() == "absent"
    report(
        "the deploy docs' container block",
        verified_webhook_s=round(verified_seconds),
        output_lines=len(output.lines),
    )


def project_containers(project: str) -> list[str]:
    listed = run(
        tool("docker"), "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"
    )
    return listed.stdout.split()
