from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection

from tests import clock, flush


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--clock-ahead-days",
        type=int,
        default=0,
        help="run with this process's clock moved this many days ahead (time-machine, ticking): "
        "no test may depend on today's date (.ci/run does it with 365)",
    )


def pytest_configure(config: pytest.Config) -> None:
    from django.test import client as test_client

    from broker.utf8_requests import Utf8WSGIRequest

    # The test client builds each request with the class broker.wsgi's application builds it with
    # (URLs and forms read as UTF-8), not with Django's own.
    test_client.WSGIRequest = Utf8WSGIRequest  # type: ignore[attr-defined]
    flush.install()  # transactional tests' tables emptied by DELETE when they hold little
    days = config.getoption("--clock-ahead-days")
    if days:
        ahead = time_machine.travel(datetime.now(UTC) + timedelta(days=days), tick=True)
        ahead.start()
        config.add_cleanup(ahead.stop)
        clock.moved_ahead = True


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups' marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip_disruptive_tests_off_the_machines_server(items)
    group_tests_that_share_a_costly_start(items)


# Under pytest-xdist (`--dist loadgroup`, pyproject.toml), the tests of a group run one after
# another in one worker: those that share a session's Spark (a JVM) or installed wheel, which each
# worker would otherwise start or build again, those of a fixed port, and those that restart the
# machine's PostgreSQL or share the Docker daemon's base image.
COSTLY_FIXTURES = {"spark": "spark-session", "installed_broker": "installed-broker"}
FIXED_PORTS = {"tests/deploy/test_runbroker.py": "ports-8000-and-9000"}
SHARED_MACHINE = {"disruptive": "machines-postgresql", "docker": "docker-daemon"}


def group_tests_that_share_a_costly_start(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        groups = [group for fixture, group in COSTLY_FIXTURES.items() if fixture in fixtures]
        groups += [group for path, group in FIXED_PORTS.items() if item.nodeid.startswith(path)]
        groups += [group for mark, group in SHARED_MACHINE.items() if item.get_closest_marker(mark)]
        if groups:
            item.add_marker(pytest.mark.xdist_group(groups[0]))


def skip_disruptive_tests_off_the_machines_server(items: list[pytest.Item]) -> None:
    """The `disruptive` tests stop and restart the machine's PostgreSQL (pg_ctlcluster): they mean
    something only when the tests' database is on it, not on the session's embedded server."""
    address = (connection.settings_dict["HOST"], str(connection.settings_dict["PORT"]))
    if address == ("127.0.0.1", "5432"):
        return
    skip = pytest.mark.skip(
        reason="restarts the machine's PostgreSQL: run with "
        "DATABASE_URL=postgres://postgres@127.0.0.1:5432/broker"
    )
    for item in items:
        if item.get_closest_marker("disruptive"):
            item.add_marker(skip)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist, a worker's fault figures travel to the controlling process, which
    prints them all (pytest_testnodedown)."""
    from tests.faults import FIGURES

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["fault_figures"] = list(FIGURES)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent with -p no:xdist
def pytest_testnodedown(node, error) -> None:
    from tests.faults import FIGURES

    FIGURES.extend(getattr(node, "workeroutput", {}).get("fault_figures", []))


def pytest_report_header() -> str:
    """Which PostgreSQL the session runs on: the embedded one of tests/embedded_database.py (its
    data directory is a temporary one) or DATABASE_URL's."""
    import psycopg

    from tests.helpers import another_session

    settings = connection.settings_dict
    where = f"{settings['HOST']}:{settings['PORT']}"
    try:
        # The database "postgres", as Django's test database creation: NAME may not exist yet.
        with another_session("postgres", connect_timeout=10) as server:
            version = server.execute("SHOW server_version").fetchone()
            directory = server.execute(
                "SELECT setting FROM pg_settings WHERE name = 'data_directory'"
            ).fetchone()  # no row for a role that may not read it
    except psycopg.Error as error:
        return f"database: {where}, which refused this session's connection: {error}"
    data = f", data directory {directory[0]}" if directory else ""
    return f"database: PostgreSQL {version[0] if version else '?'} on {where}{data}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: the system tools it is marked `needs_tool` with, or a skip
    that names what to install (a failure under BROKER_TESTS_REQUIRE_TOOLS=1; tests/tools.py)."""
    from tests.tools import require_marked_tools

    require_marked_tools(item)


def pytest_terminal_summary(terminalreporter) -> None:
    from tests.faults import FIGURES

    if FIGURES:
        terminalreporter.section("fault injection figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


ADMIN_TOKEN = "test-admin-token"
FORM = "application/x-www-form-urlencoded"


@pytest.fixture(autouse=True)
def claim_bound_worked_out_afresh():
    """The push claim's lower bound of partitions (jobs/partitions/pending.py) is kept in the
    process's memory for seconds: one test's database must not bound the next one's claims."""
    from jobs.partitions import pending

    pending.forget()


@pytest.fixture(autouse=True)
def unknown_consumer_tokens():
    """No consumer's token checked yet by this process (jobs/api/access.py's CheckedTokens): a
    test's pull requests take the step-by-step checks first, as a new server process does."""
    from jobs.api.access import checked_tokens

    checked_tokens.forget()


@pytest.fixture(autouse=True)
def unspent_schema_allowances(monkeypatch):
    """Every producer's allowance of schema checking unspent: it is kept in the process's memory
    (broker/schema_allowance.py), and one test's costly payloads must not refuse the next's."""
    from broker import schema_allowance

    monkeypatch.setattr(schema_allowance, "ALLOWANCES", schema_allowance.Allowances())


@pytest.fixture
def admin_client(client, settings):
    """A test client that authenticates as admin with a BROKER_ADMIN_TOKENS bearer token."""
    settings.BROKER_ADMIN_TOKENS = [ADMIN_TOKEN]
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {ADMIN_TOKEN}"
    return client


@pytest.fixture
def superuser_client(client):
    """The test client logged in as a Django superuser, "ops" (password "pw")."""
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    return client


@pytest.fixture
def channel():
    """The "orders" channel and the "shop" producer, with tests/helpers.py's tokens. A module that
    needs another set-up (with consumers, without a producer...) defines a `channel` of its own."""
    from tests.helpers import make_channel, make_producer

    make_producer()
    return make_channel()


@pytest.fixture
def dispatcher():
    """A dispatcher of the test process, run a step at a time (tests/delivery.py: run_once)."""
    from jobs.dispatch import Dispatcher, DispatcherConfig

    return Dispatcher(DispatcherConfig(dispatcher_id="test-dispatcher"))


@pytest.fixture
def receiver():
    """A webhook receiver on loopback (tests/receiver.py), stopped after the test."""
    from tests.receiver import Receiver

    running = Receiver().start()
    yield running
    running.stop()


@pytest.fixture(scope="session")
def installed_broker(tmp_path_factory):
    """The broker's wheel in a fresh venv, as a host project has it (tests/packaging.py)."""
    from tests.clock import skip_if_moved
    from tests.packaging import install_wheel

    skip_if_moved()
    return install_wheel(tmp_path_factory.mktemp("installed"))
