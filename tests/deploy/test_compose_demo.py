"""compose.yaml's `demo` profile (docs/deploy.md, "Try it with Docker"): its services as Compose
reads them, what the image carries for it, the docs' block that starts it, and the publisher
(docs/examples/demo_publisher.py) against a real web server on the test's database.
tests/deploy/test_container_demo.py runs the whole block on Docker (`-m docker`).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys

import pytest

from broker.models import Message
from consumers.models import Consumer
from tests import ROOT
from tests.api_server import running_api
from tests.deploy.test_deploy_files import COMPOSE, DEMO_SERVICES, final_stage

PUBLISHER = ROOT / "docs" / "examples" / "demo_publisher.py"


def test_the_image_has_the_example_receiver_and_the_demo_publisher():
    copied = [a.split() for n, a in final_stage() if n == "COPY" and "docs/examples/" in a]
    assert copied == [
        ["docs/examples/receiver.py", "docs/examples/demo_publisher.py", "/opt/broker/examples/"]
    ]
    pinned = (ROOT / "requirements-examples.txt").read_text()
    assert re.search(r"^standardwebhooks==", pinned, re.MULTILINE)
    assert "-r requirements-examples.txt" in (ROOT / "requirements-dev.txt").read_text()


def test_the_demo_profile_publishes_to_a_receiver_that_verifies_with_the_same_secret():
    services = COMPOSE["services"]
    for name in DEMO_SERVICES:
        assert services[name]["profiles"] == ["demo"], name  # a plain `up` leaves them out
        assert services[name]["image"] == "${BROKER_IMAGE:-webhook-broker:latest}", name
    receiver, publisher = services["demo-receiver"], services["demo-publisher"]
    assert receiver["command"][:2] == ["python3", "/opt/broker/examples/receiver.py"]
    assert publisher["command"] == ["python3", "/opt/broker/examples/demo_publisher.py"]
    secret = "${BROKER_DEMO_SIGNING_SECRET:-}"  # optional: a deployment without the demo runs
    assert receiver["environment"]["WEBHOOK_SECRET"] == secret
    assert publisher["environment"]["BROKER_DEMO_SIGNING_SECRET"] == secret
    # The callback reaches the receiver's service at the port it listens on.
    callback = publisher["environment"]["BROKER_DEMO_CALLBACK_URL"]
    listening = receiver["command"]
    assert callback == (f"http://demo-receiver:{listening[listening.index('--port') + 1]}/hook")
    assert listening[listening.index("--host") + 1] == "0.0.0.0"  # noqa: S104 (the network's)
    assert publisher["environment"]["BROKER_URL"] == "http://web:8000"
    assert "web" in COMPOSE["x-broker-environment"]["DJANGO_ALLOWED_HOSTS"]
    assert publisher["depends_on"] == {
        "web": {"condition": "service_healthy"},
        "demo-receiver": {"condition": "service_healthy"},
    }
    assert publisher["restart"] == "no"


def test_the_readme_points_to_the_docker_block_which_names_what_it_installs():
    assert "docs/deploy.md#try-it-with-docker" in (ROOT / "README.md").read_text()
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert "## Try it with Docker" in deploy
    block = deploy.split("<!-- container-demo -->\n```sh\n", 1)[1].split("\n```", 1)[0]
    for package in ("docker.io", "docker-compose", "debootstrap"):
        assert package in block
    assert block.splitlines()[-1] == "docker-compose --profile demo up"


def test_what_pip_may_need_has_a_directory_in_every_clone_and_is_never_committed():
    # The Dockerfile copies deploy/pip/ (COPY needs it to exist): its README keeps it there.
    assert (ROOT / "deploy" / "pip" / "README.md").is_file()
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert {"/deploy/pip/*", "!/deploy/pip/README.md"} <= set(ignored)


def publish(**environment: str) -> subprocess.CompletedProcess[str]:
    """docs/examples/demo_publisher.py as the demo's one-shot runs it: a process of its own."""
    demo_variables = ("BROKER_URL", "BROKER_ADMIN_TOKENS", "BROKER_DEMO_")
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(demo_variables)}
    return subprocess.run(
        [sys.executable, str(PUBLISHER)],
        env={**inherited, **environment},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.django_db(transaction=True)
def test_the_publisher_registers_the_receiver_with_the_demo_secret_and_publishes_each_run():
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    callback = "http://127.0.0.1:9/hook"
    with running_api(
        BROKER_ADMIN_TOKENS="admin-one,admin-two", BROKER_ALLOW_PRIVATE_CALLBACKS="true"
    ) as server:
        runs = [
            publish(
                BROKER_URL=server.url(""),
                BROKER_ADMIN_TOKENS="admin-one, admin-two",
                BROKER_DEMO_SIGNING_SECRET=secret,
                BROKER_DEMO_CALLBACK_URL=callback,
            )
            for _ in range(2)  # the second updates all three (If-Unmodified-Since)
        ]

    for run in runs:
        assert run.returncode == 0, run.stderr
        assert "demo: published " in run.stdout
        assert secret not in run.stdout + run.stderr
    consumer = Consumer.objects.get(channel_id="demo", public_id="demo-receiver")
    assert consumer.signing_secret == secret  # what the receiver verifies with
    assert consumer.callback_url == callback
    payloads = [bytes(m.payload) for m in Message.objects.filter(channel_id="demo")]
    assert [json.loads(p) for p in payloads] == [
        {"order": 1, "note": "published by the compose demo"}
    ] * 2
    assert {m.producer_id for m in Message.objects.filter(channel_id="demo")} == {"demo-publisher"}


@pytest.mark.django_db(transaction=True)
def test_without_private_callbacks_the_publisher_says_what_to_set():
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    with running_api(
        BROKER_ADMIN_TOKENS="admin-one", BROKER_ALLOW_PRIVATE_CALLBACKS="false"
    ) as server:
        refused = publish(
            BROKER_URL=server.url(""),
            BROKER_ADMIN_TOKENS="admin-one",
            BROKER_DEMO_SIGNING_SECRET=secret,
            BROKER_DEMO_CALLBACK_URL="http://127.0.0.1:9/hook",
        )
    assert refused.returncode == 1
    assert "BROKER_ALLOW_PRIVATE_CALLBACKS=true" in refused.stderr
    assert not Message.objects.exists()


def test_without_the_demo_secret_the_publisher_names_it():
    missing = publish(BROKER_URL="http://127.0.0.1:9", BROKER_ADMIN_TOKENS="admin-one")
    assert missing.returncode == 1
    assert re.search(r"set .*BROKER_DEMO_SIGNING_SECRET", missing.stderr)
