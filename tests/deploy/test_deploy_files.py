"""The deployment files, read as their tools read them (docs/deploy.md): the Dockerfile,
compose.yaml and the Kubernetes example. No Docker needed; tests/deploy/test_container_stack.py
runs them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import shlex
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from django.core.management import get_commands, load_command_class
from gunicorn.config import Config as GunicornConfig

from broker import gunicorn_conf
from broker.management.commands.runbroker import web_command
from jobs.dispatch import DispatcherConfig
from tests import ROOT

KUBERNETES = ROOT / "deploy" / "kubernetes"
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
MANIFESTS = [
    (path.relative_to(ROOT), document)
    for path in sorted(KUBERNETES.rglob("*.yaml"))
    for document in yaml.safe_load_all(path.read_text())
    if document is not None
]
PYTHON_SERVICES = ["migrate", "web", "dispatcher", "housekeeping"]
# The `demo` profile (docs/deploy.md, "Try it with Docker"): started only with --profile demo.
DEMO_SERVICES = ["demo-receiver", "demo-publisher"]


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile()
    last_from = max(i for i, (name, _) in enumerate(instructions) if name == "FROM")
    return instructions[last_from:]


def image_user_id() -> int:
    user = [arguments for name, arguments in final_stage() if name == "USER"][-1]
    return int(user.split(":")[0])


# --- the Dockerfile --------------------------------------------------------------------------


def test_both_stages_build_on_an_official_slim_python_by_default():
    instructions = dockerfile()
    default = next(a for n, a in instructions if n == "ARG" and a.startswith("BASE_IMAGE="))
    assert re.fullmatch(r"BASE_IMAGE=python:3\.11(\.\d+)?-slim(-bookworm)?", default)
    stages = [arguments.split() for name, arguments in instructions if name == "FROM"]
    assert len(stages) == 2  # a builder and the runtime
    assert all(stage[0] == "${BASE_IMAGE}" for stage in stages)


def test_the_image_runs_as_a_numeric_user_that_is_not_root():
    # Numeric, or Kubernetes' runAsNonRoot cannot verify it.
    assert image_user_id() > 0


def test_the_image_sets_the_broker_up_and_serves_on_port_8000():
    stage = final_stage()
    environment = dict(
        item.split("=", 1) for name, a in stage if name == "ENV" for item in shlex.split(a)
    )
    assert environment["DJANGO_SETTINGS_MODULE"] == "broker.settings"
    assert environment["BROKER_LOG_FORMAT"] == "json"
    assert ("EXPOSE", "8000") in stage
    assert any(name == "RUN" and "collectstatic" in a for name, a in stage)
    command = next(yaml.safe_load(a) for name, a in stage if name == "CMD")  # exec form
    assert command[0] == "gunicorn"
    assert gunicorn_options(command).args == ["broker.wsgi"]
    assert command[command.index("--bind") + 1] == "0.0.0.0:8000"
    assert ("WORKDIR", "/var/lib/broker") in stage


def test_any_builder_builds_it_and_pip_reads_the_build_hosts_files_in_the_builder_only():
    instructions = dockerfile()
    # The legacy builder (a docker CLI without buildx) refuses RUN --mount.
    assert not any("--mount" in arguments for _, arguments in instructions)
    installs = [a for name, a in instructions if name == "RUN" and "pip install" in a]
    assert len(installs) == 2  # the pinned requirements, then the package itself
    for install in installs:
        assert "PIP_CERT=/pip/ca.crt" in install
        assert "PIP_CONFIG_FILE=/pip/pip.conf" in install
    assert "-r requirements-examples.txt" in installs[0]  # the example receiver's verifier
    assert "python3 -m venv /opt/venv" in " ".join(a for n, a in instructions if n == "RUN")
    # deploy/pip/ goes into the builder stage only, and no variable carries it on.
    builder = instructions[: len(instructions) - len(final_stage())]
    assert ("COPY", "deploy/pip/ /pip/") in builder
    assert not any("pip" in a for n, a in final_stage() if n == "COPY" and "--from" not in a)
    for name, arguments in instructions:
        if name in ("ARG", "ENV"):
            assert not re.search(r"CERT|PIP_CONF|INDEX|TOKEN|PASSWORD", arguments), arguments


def test_the_build_context_leaves_out_everything_but_what_the_build_reads():
    patterns = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    included = {pattern.removeprefix("!").rstrip("/") for pattern in patterns if pattern[0] == "!"}
    assert included == {
        "requirements.txt",
        "requirements-otel.txt",
        "requirements-examples.txt",
        "pyproject.toml",
        "README.md",
        # The package's folders (README.md, "Layout"; broker/templates and broker/static link to
        # templates/ and static/).
        "broker",
        "consumers",
        "jobs",
        "spark_etl",
        "templates",
        "static",
        # What pip may need from the build host; the example receiver, the demo's publisher.
        "deploy/pip",
        "docs/examples/receiver.py",
        "docs/examples/demo_publisher.py",
    }


# --- compose.yaml ----------------------------------------------------------------------------


def test_compose_uses_only_what_compose_v1_and_v2_both_read():
    assert "version" not in COMPOSE  # optional since docker-compose 1.27, obsolete in v2
    assert {key for key in COMPOSE if not key.startswith("x-")} == {"services", "volumes"}
    assert set(COMPOSE["services"]) == {"postgres", *PYTHON_SERVICES, *DEMO_SERVICES}
    for service in COMPOSE["services"].values():
        assert "scale" not in service  # deploy.replicas, which both honour
        assert "container_name" not in service  # would stop replicas and parallel projects
        for dependency in (service.get("depends_on") or {}).values():
            assert dependency["condition"] in {
                "service_started",
                "service_healthy",
                "service_completed_successfully",
            }


def test_every_compose_service_has_a_health_check_and_python_ones_an_init():
    for name, service in COMPOSE["services"].items():
        if name == "demo-publisher":
            continue  # a one-shot that nothing waits for
        assert service["healthcheck"]["test"][0] == "CMD", name
        assert not service["healthcheck"].get("disable"), name
    for name in [*PYTHON_SERVICES, *DEMO_SERVICES]:
        assert COMPOSE["services"][name]["init"] is True, name


def test_compose_runs_two_dispatchers_after_the_migrations():
    services = COMPOSE["services"]
    assert services["dispatcher"]["deploy"]["replicas"] == 2
    assert services["migrate"]["restart"] == "no"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("web", "dispatcher", "housekeeping"):
        assert services[name]["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "migrate": {"condition": "service_completed_successfully"},
        }
    assert services["postgres"]["image"].startswith("${BROKER_POSTGRES_IMAGE:-postgres:15")


def probed_url(test: list[str]) -> re.Match[str]:
    """The URL a `python3 -c "... urlopen('URL' ...)"` health check opens."""
    match = re.search(r"urlopen\('http://127\.0\.0\.1:(\d+)(/[^']*)'", test[-1])
    assert match, test
    return match


def test_compose_health_checks_ask_the_ports_the_processes_serve():
    services = COMPOSE["services"]
    web = probed_url(services["web"]["healthcheck"]["test"])
    assert (web[1], web[2]) == ("8000", "/_status")  # the image's gunicorn --bind
    dispatcher = services["dispatcher"]
    command = dispatcher["command"]
    checked = probed_url(dispatcher["healthcheck"]["test"])
    assert checked[1] == command[command.index("--health-port") + 1]
    assert checked[2] in ("/readyz", "/livez")


def seconds(duration: str) -> float:
    value, unit = re.fullmatch(r"(\d+)(s|m)", duration).groups()  # type: ignore[union-attr]
    return int(value) * (60 if unit == "m" else 1)


def grace_seconds(command: list[str]) -> float:
    if "--grace-seconds" in command:
        return float(command[command.index("--grace-seconds") + 1])
    return DispatcherConfig().grace_seconds


def test_compose_gives_the_dispatcher_time_to_drain_before_sigkill():
    dispatcher = COMPOSE["services"]["dispatcher"]
    assert seconds(dispatcher["stop_grace_period"]) > grace_seconds(dispatcher["command"])


def test_compose_takes_secrets_from_the_environment_as_the_example_names_them():
    text = (ROOT / "compose.yaml").read_text()
    required = set(re.findall(r"\$\{(\w+):\?", text))
    assert {"DJANGO_SECRET_KEY", "BROKER_ADMIN_TOKENS", "BROKER_POSTGRES_PASSWORD"} <= required
    example = (ROOT / "deploy" / "compose.env.example").read_text()
    assert required <= set(re.findall(r"^(\w+)=", example, re.MULTILINE))
    environment = COMPOSE["x-broker-environment"]
    assert environment["DJANGO_SECRET_KEY"].startswith("${DJANGO_SECRET_KEY:?")


# --- the Kubernetes example ------------------------------------------------------------------


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for _, document in MANIFESTS:
        if document["kind"] in ("Deployment", "Job"):
            yield document["metadata"]["name"], document["spec"]["template"]["spec"]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def named(kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in MANIFESTS if d["kind"] == kind and d["metadata"]["name"] == name)


def test_every_manifest_is_a_kubernetes_object():
    assert {document["kind"] for _, document in MANIFESTS} >= {
        "Deployment",
        "Job",
        "Service",
        "ConfigMap",
        "Secret",
    }
    for path, document in MANIFESTS:
        assert isinstance(document.get("apiVersion"), str), path
        assert document.get("kind"), path
        assert document["metadata"]["name"], path


def test_every_pod_runs_as_the_images_non_root_user():
    for name, spec in pod_specs():
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True, name
        assert context["runAsUser"] == image_user_id(), name
        for container in containers(spec):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_probes_point_at_ports_their_container_declares():
    probes = 0
    for name, spec in pod_specs():
        for container in containers(spec):
            declared = {p["containerPort"] for p in container.get("ports", [])} | {
                p["name"] for p in container.get("ports", [])
            }
            for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
                probe = container.get(kind, {})
                for action in ("httpGet", "tcpSocket"):
                    if action in probe:
                        assert probe[action]["port"] in declared, (name, kind)
                        probes += 1
    assert probes >= 4


def test_the_dispatchers_serve_their_probes_where_the_kubelet_asks():
    spec = named("Deployment", "broker-dispatcher")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    command = container["command"]
    assert command[command.index("--health-address") + 1] == "0.0.0.0"  # noqa: S104 (the pod's)
    port = int(command[command.index("--health-port") + 1])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for kind, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        assert container[kind]["httpGet"]["path"] == path
        assert ports[container[kind]["httpGet"]["port"]] == port
    assert spec["terminationGracePeriodSeconds"] > grace_seconds(command)


def test_the_web_pods_are_ready_by_status_with_an_allowed_host():
    (container,) = named("Deployment", "broker-web")["spec"]["template"]["spec"]["containers"]
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/_status"
    host = next(h["value"] for h in probe["httpHeaders"] if h["name"] == "Host")
    allowed = named("ConfigMap", "broker-config")["data"]["DJANGO_ALLOWED_HOSTS"].split(",")
    assert host in allowed


def test_services_and_references_name_objects_of_the_example():
    labels = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
        for _, d in MANIFESTS
        if d["kind"] == "Deployment"
    }
    for _, document in MANIFESTS:
        if document["kind"] == "Deployment":
            assert (
                document["spec"]["selector"]["matchLabels"].items()
                <= labels[document["metadata"]["name"]].items()
            )
        if document["kind"] == "Service":
            selector = document["spec"]["selector"].items()
            assert any(selector <= pod.items() for pod in labels.values())
    defined = {(d["kind"], d["metadata"]["name"]) for _, d in MANIFESTS}
    for name, spec in pod_specs():
        for container in containers(spec):
            for source in container.get("envFrom", []):
                for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                    if key in source:
                        assert (kind, source[key]["name"]) in defined, name
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", claim) in defined


# --- the commands all of them run --------------------------------------------------------------


def commands_run() -> Iterator[tuple[str, list[str]]]:
    """(where, argv) of every command the deployment files run, `sh -c` scripts split up."""
    for name, service in COMPOSE["services"].items():
        yield f"compose {name}", service.get("command") or []
        yield f"compose {name} healthcheck", service.get("healthcheck", {"test": []})["test"][1:]
    for name, spec in pod_specs():
        for container in containers(spec):
            yield f"{name} {container['name']}", container.get("command", [])
            for kind in ("livenessProbe", "readinessProbe"):
                yield f"{name} {kind}", container.get(kind, {}).get("exec", {}).get("command", [])
    yield "Dockerfile CMD", next(yaml.safe_load(a) for n, a in final_stage() if n == "CMD")


def simple_commands(argv: list[str]) -> Iterator[list[str]]:
    """argv itself, or the simple commands of the script of `sh -c SCRIPT`."""
    if argv[:2] != ["sh", "-c"]:
        yield argv
        return
    lexer = shlex.shlex(argv[2], posix=True, punctuation_chars=True)
    command: list[str] = []
    for token in lexer:
        if token in (";", "&&", "||", "|"):
            yield command
            command = []
        elif token not in ("until", "while", "do", "done", "then", "fi", "if"):
            command.append(token)
    yield command


RUN = [(where, argv) for where, argv in commands_run() if argv]


@pytest.mark.parametrize(("where", "argv"), RUN, ids=[where for where, _ in RUN])
def test_every_command_the_deployment_runs_exists_and_takes_its_options(where, argv):
    for command in simple_commands(argv):
        if command and command[0] in ("django-admin", "manage.py"):
            name, *options = command[1:]
            assert name in get_commands(), where
            parser = load_command_class(get_commands()[name], name).create_parser("", name)
            parsed = parser.parse_args(options)  # exits (fails the test) on an unknown option
            if name == "shell":
                for module, attribute in re.findall(r"from ([\w.]+) import (\w+)", parsed.command):
                    assert hasattr(importlib.import_module(module), attribute), where
        elif command and command[0] == "gunicorn":
            parsed = gunicorn_options(command)  # exits (fails the test) on an unknown option
            assert all(importlib.util.find_spec(app.split(":")[0]) for app in parsed.args), where


def gunicorn_options(command: list[str]) -> argparse.Namespace:
    """A gunicorn command line as gunicorn's own parser reads it."""
    options: argparse.Namespace = GunicornConfig().parser().parse_args(command[1:])
    return options


def test_every_web_server_runs_with_the_brokers_gunicorn_settings():
    # broker/gunicorn_conf.py: threads, so that long polls cannot take the web tier (issue 36).
    web_servers = [argv for _, argv in RUN if argv[0] == "gunicorn"]
    web_servers.append(web_command("127.0.0.1:8000", 2)[2:])  # manage.py runbroker's

    assert len(web_servers) == 3  # the image's, Kubernetes' and runbroker's
    for command in web_servers:
        assert gunicorn_options(command).config == gunicorn_conf.CONFIG
