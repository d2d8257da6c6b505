"""The container image and compose.yaml with a real Docker daemon (docs/deploy.md).

Marked `docker`, so the default test command leaves it out: `.venv/bin/pytest -m docker` (a step
of .ci/run) needs root, a running dockerd, docker-compose (v1, or Compose v2 as `docker compose`)
and debootstrap. No registry is reachable here, so the base image is a Debian bookworm made by
debootstrap (tests/deploy/docker_base.py), and PostgreSQL is deploy/postgres built on it. Every
container talks to the others over the compose network and to the test over ports published on
127.0.0.1 only.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook

from jobs.models import Job
from jobs.states import DELIVERED
from tests import ROOT
from tests.clock import skip_if_moved
from tests.deploy.docker_base import (
    BASE_IMAGE,
    copy_of_working_tree,
    ensure_base_image,
    run,
    tool,
)
from tests.faults import report
from tests.processes import free_port

pytestmark = pytest.mark.docker

BROKER_IMAGE = "webhook-broker:stack-test"
POSTGRES_IMAGE = "broker-postgres:15-stack-test"
SERVICES = {"postgres": 1, "migrate": 1, "web": 1, "dispatcher": 2, "housekeeping": 1}
RECEIVER_DELAY_SECONDS = 1  # keeps deliveries in flight when the stack is stopped
BATCH = 200
# At most this many of the consumer's jobs in flight: 200 take about 10 s, so the stop finds some
# in flight (they drain) and most still queued (delivered after the restart).
MAX_IN_FLIGHT = 20


def compose_command() -> list[str]:
    """docker-compose (v1, Debian's), else Compose v2 as a docker plugin."""
    if shutil.which("docker-compose"):
        return [tool("docker-compose")]
    return [tool("docker"), "compose"]


def pip_cert() -> str | None:
    """The CA bundle pip uses on this machine (a network that re-signs TLS has its own CA)."""
    for path in (os.environ.get("PIP_CERT"), "/etc/ssl/certs/ca-certificates.crt"):
        if path and Path(path).is_file():
            return path
    return None


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """The base, broker and PostgreSQL images, built (the base only when absent), with how
    long each took. Whichever builder the docker CLI has builds them (the Dockerfile mounts
    nothing); the broker's image from a copy of the working tree, with this machine's CA bundle
    as deploy/pip/ca.crt."""
    skip_if_moved()  # the stack runs on the real clock; the signatures' timestamps too
    timings = {}
    started = time.monotonic()
    ensure_base_image()
    timings["base_s"] = time.monotonic() - started

    build = [tool("docker"), "build", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}"]
    started = time.monotonic()
    context = copy_of_working_tree(tmp_path_factory.mktemp("stack") / "clone")
    if cert := pip_cert():
        shutil.copyfile(cert, context / "deploy" / "pip" / "ca.crt")
    run(*build, "-t", BROKER_IMAGE, str(context))
    timings["broker_image_s"] = time.monotonic() - started
    # The CA bundle was in the builder stage only: neither the runtime stage's history nor its
    # environment mentions it.
    history = run(tool("docker"), "history", "--no-trunc", BROKER_IMAGE).stdout
    environment_of_image = run(
        tool("docker"), "image", "inspect", "--format", "{{json .Config.Env}}", BROKER_IMAGE
    ).stdout
    assert "/pip/" not in history
    assert "PIP_" not in environment_of_image
    started = time.monotonic()
    run(*build, "-t", POSTGRES_IMAGE, str(context / "deploy" / "postgres"))
    timings["postgres_image_s"] = time.monotonic() - started
    return timings


def wait_until(condition: Any, seconds: float) -> float:
    """Poll `condition()` once a second (each poll runs docker commands) until it is true; how
    long that took. Fails after `seconds`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > seconds:
            pytest.fail(f"not within {seconds} s: {getattr(condition, '__name__', condition)}")
        time.sleep(1)
    return time.monotonic() - started


class Stack:
    """One compose project of compose.yaml plus tests/deploy/compose.receiver.yaml."""

    def __init__(self, received_dir: Path) -> None:
        self.project = f"brokerstack{os.getpid()}{secrets.token_hex(3)}"
        self.received_file = received_dir / "requests.jsonl"
        self.port = free_port()
        self.admin_token = secrets.token_urlsafe(24)
        self.environment = {
            **os.environ,
            "BROKER_IMAGE": BROKER_IMAGE,
            "BROKER_POSTGRES_IMAGE": POSTGRES_IMAGE,
            "BROKER_POSTGRES_PASSWORD": secrets.token_hex(16),
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(48),
            "BROKER_ADMIN_TOKENS": self.admin_token,
            "BROKER_WEB_PORT": str(self.port),
            "BROKER_TEST_RECEIVED_DIR": str(received_dir),
            "BROKER_TEST_RECEIVER_DELAY": str(RECEIVER_DELAY_SECONDS),
        }

    def compose(self, *arguments: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        files = [
            "-f",
            str(ROOT / "compose.yaml"),
            "-f",
            str(ROOT / "tests/deploy/compose.receiver.yaml"),
        ]
        return run(
            *compose_command(),
            "-p",
            self.project,
            *files,
            *arguments,
            env=self.environment,
            cwd=ROOT,
            timeout=timeout,
        )

    def containers(self) -> list[dict[str, Any]]:
        listed = run(
            tool("docker"),
            "ps",
            "-aq",
            "--filter",
            f"label=com.docker.compose.project={self.project}",
        ).stdout.split()
        if not listed:
            return []
        return list(json.loads(run(tool("docker"), "inspect", *listed).stdout))

    def states(self) -> list[tuple[str, str]]:
        """(service, state) of each container: its health, or for migrate how it exited."""
        states = []
        for container in self.containers():
            service = container["Config"]["Labels"]["com.docker.compose.service"]
            state = container["State"]
            if service == "migrate" and state["Status"] == "exited":
                states.append((service, f"exited {state['ExitCode']}"))
            else:
                states.append((service, state.get("Health", {}).get("Status", state["Status"])))
        return sorted(states)

    def wait_healthy(self, seconds: float) -> float:
        """Wait until every service runs healthy (migrate: exited 0); how long it took."""
        expected = sorted(
            (service, "exited 0" if service == "migrate" else "healthy")
            for service, replicas in {**SERVICES, "receiver": 1}.items()
            for _ in range(replicas)
        )
        started = time.monotonic()
        while (states := self.states()) != expected:
            if ("migrate", "exited 1") in states or time.monotonic() - started > seconds:
                pytest.fail(f"the stack is not healthy: {states}\n{self.logs()}")
            time.sleep(1)
        return time.monotonic() - started

    def logs(self, *services: str, tail: int = 40) -> str:
        """The services' last log lines (each process's, not the deliveries': too many)."""
        lines = self.compose("logs", "--no-color", "--tail", str(tail), *services).stdout
        noise = ("broker.deliveries", "broker.access")
        return "\n".join(line for line in lines.splitlines() if not any(n in line for n in noise))

    def api(
        self, method: str, path: str, data: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (127.0.0.1)
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            with error:
                return error.code, dict(error.headers), error.read()

    def admin(self, method: str, path: str, **form: str) -> tuple[int, bytes]:
        status, _, body = self.api(
            method,
            path,
            urllib.parse.urlencode(form).encode(),
            {
                "Authorization": f"Bearer {self.admin_token}",
                "Content-Type": "application/x-www-form-urlencoded",
            },
        )
        return status, body

    def broadcast(self, body: bytes) -> str:
        """Publish to channel "orders"; the message's ID."""
        status, headers, answer = self.api(
            "POST",
            "/channel/orders/broadcast",
            body,
            {
                "X-Broker-Channel-Token": "channel-token",
                "X-Broker-Producer-ID": "shop",
                "X-Broker-Producer-Token": "producer-token",
                "Content-Type": "application/json",
            },
        )
        assert status == 201, answer
        return headers["Location"].rstrip("/").rsplit("/", 1)[1]

    def received(self) -> list[dict[str, Any]]:
        if not self.received_file.exists():
            return []
        lines = self.received_file.read_text().splitlines()
        requests = []
        for line in lines:
            with contextlib.suppress(ValueError):  # a line being written
                requests.append(json.loads(line))
        return requests

    def received_ids(self) -> set[str]:
        return {request["headers"].get("x-broker-message-id") for request in self.received()}

    def job_statuses(self) -> dict[str, int]:
        query = f"SELECT status, count(*) FROM {Job._meta.db_table} GROUP BY status"  # noqa: S608
        answer = self.compose(
            "exec", "-T", "postgres", "psql", "-U", "broker", "-d", "broker", "-tA", "-c", query
        ).stdout
        return {status: int(n) for status, n in (line.split("|") for line in answer.split())}


@pytest.fixture
def stack(images: dict[str, float]) -> Iterator[Stack]:
    received_dir = Path(tempfile.mkdtemp(prefix="broker-stack-received-"))
    received_dir.chmod(0o777)  # the receiver writes as the image's user
    running = Stack(received_dir)
    try:
        yield running
    finally:
        with contextlib.suppress(BaseException):
            print(running.logs())  # shown when the test failed
        subprocess.run(
            [
                *compose_command(),
                "-p",
                running.project,
                "-f",
                str(ROOT / "compose.yaml"),
                "-f",
                str(ROOT / "tests/deploy/compose.receiver.yaml"),
                "down",
                "-v",
                "--remove-orphans",
                "--timeout",
                "30",
            ],
            env=running.environment,
            cwd=ROOT,
            capture_output=True,
            timeout=300,
            check=False,
        )
        shutil.rmtree(received_dir, ignore_errors=True)


def exit_codes(stack: Stack) -> dict[str, list[int]]:
    codes: dict[str, list[int]] = {}
    for container in stack.containers():
        service = container["Config"]["Labels"]["com.docker.compose.service"]
        codes.setdefault(service, []).append(container["State"]["ExitCode"])
    return codes


def test_the_stack_delivers_signed_and_loses_nothing_across_a_graceful_stop(images, stack):
    started = time.monotonic()
    stack.compose("up", "-d", "--no-build")
    first_up = stack.wait_healthy(seconds=300)

    assert stack.admin("PUT", "/channel/orders", token="channel-token")[0] in (200, 201)
    assert stack.admin("PUT", "/producer/shop", token="producer-token")[0] in (200, 201)
    status, body = stack.admin(
        "PUT",
        "/channel/orders/consumer/receiver",
        callbackUrl="http://receiver:9000/hook",
        token="consumer-token",
        maxInFlight=str(MAX_IN_FLIGHT),
    )
    assert status in (200, 201), body
    status, body = stack.admin("GET", "/channel/orders/consumer/receiver/secret")
    assert status == 200, body
    signing_secret = json.loads(body)["SigningSecret"]

    first = stack.broadcast(b'{"order": 1}')
    wait_until(lambda: first in stack.received_ids(), seconds=120)
    delivery = next(r for r in stack.received() if r["headers"]["x-broker-message-id"] == first)
    payload = base64.b64decode(delivery["body"])
    assert payload == b'{"order": 1}'
    assert {"webhook-id", "webhook-timestamp", "webhook-signature"} <= delivery["headers"].keys()
    Webhook(signing_secret).verify(payload, delivery["headers"])  # raises unless signed right

    batch = {stack.broadcast(json.dumps({"order": n}).encode()) for n in range(BATCH)}
    arrived_before_stop = len(batch & stack.received_ids())
    stopping = time.monotonic()
    stack.compose("stop")  # SIGTERM to each container; dispatchers drain, then exit
    stop_seconds = time.monotonic() - stopping
    drained = len(batch & stack.received_ids()) - arrived_before_stop  # finished while stopping
    codes = exit_codes(stack)
    # Graceful: no process was killed at the end of its stop_grace_period (137).
    assert codes["dispatcher"] == [0, 0], (codes, stack.logs("dispatcher"))
    assert codes["web"] == [0], (codes, stack.logs("web"))

    stack.compose("up", "-d", "--no-build")
    second_up = stack.wait_healthy(seconds=300)
    wait_until(lambda: stack.job_statuses() == {DELIVERED.value: BATCH + 1}, seconds=300)

    received = [r["headers"]["x-broker-message-id"] for r in stack.received()]
    assert batch | {first} <= set(received)  # every message arrived, at least once
    report(
        "container stack",
        **{name: round(seconds) for name, seconds in images.items()},
        first_up_s=round(first_up),
        delivered_before_stop=arrived_before_stop,
        delivered_while_stopping=drained,
        stop_s=round(stop_seconds),
        second_up_s=round(second_up),
        duplicates=len(received) - len(set(received)),
        total_s=round(time.monotonic() - started),
    )
