"""The README's test command on a fresh machine with Python only (issue 37, item 2).

A container of the base image (tests/deploy/docker_base.py: Debian bookworm, Python 3.11 and its
venv module; no PostgreSQL, no Chromium, no Java), as a user who is not root, with the working
tree (what `git ls-files` lists, tracked or new; not .venv) and no network: the README's test
command as written, on a subset of the suite that takes about two minutes. It passes on the
session's embedded PostgreSQL, and the tests that need Chromium or Java skip themselves, naming
what to install (tests/tools.py).

Its packages come from a directory of wheels that this machine's pip makes first
(`pip wheel -r requirements-dev.txt` and the build backend, from pip's cache when the venv was
just installed): the container's pip reads it through PIP_NO_INDEX and PIP_FIND_LINKS, as a
machine's pip configuration names its package index. This machine's package sources (a proxy's
CA, local indexes) are not the container's, and the test must not depend on the network's mood.

Marked `docker`, so the default test command leaves it out: `.venv/bin/pytest -m docker`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests import ROOT
from tests.deploy.docker_base import BASE_IMAGE, ensure_base_image, run, tool, working_tree
from tests.embedded_database import PREFIX as EMBEDDED_SERVER_DIRECTORY
from tests.faults import report
from tests.tools import REQUIRE_TOOLS

pytestmark = pytest.mark.docker

# Areas on the database's every path (the queue's statements, publishing in the caller's
# transaction), and a module of each area that needs a tool the container lacks.
SUBSET = ["tests/queue", "tests/publishing", "tests/ui/test_reports.py", "tests/spark"]
# Programs a machine with PostgreSQL, Chromium or Java installed has on its PATH.
ABSENT_PROGRAMS = ["postgres", "initdb", "pg_ctl", "psql", "pg_ctlcluster", "chromium", "java"]
USER = "developer"
CONTAINER_SECONDS = 900


def readme_command(marker: str) -> str:
    """The command in the ```sh block that follows <!-- marker --> in the README (as .ci/run
    reads it)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    block = lines.index(f"<!-- {marker} -->") + 1
    assert lines[block].startswith("```sh")
    return lines[block + 1]


def wheelhouse(directory: Path) -> Path:
    """Wheels of what the test command installs, and of the broker's build backend (the tests
    build the broker's wheel: tests/packaging.py)."""
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    run(sys.executable, "-m", "pip", "wheel", "-q", "-r", str(ROOT / "requirements-dev.txt"),
        *build, "-w", str(directory), timeout=900)  # fmt: skip
    return directory


def container_script(test_command: str) -> str:
    """Root checks that the machine lacks the tools and makes the user; the user runs the
    command in the tree's copy in its home."""
    absent = " ".join(ABSENT_PROGRAMS)
    home = f"/home/{USER}"
    return f"""
        set -eu
        for program in {absent}; do
            if command -v "$program"; then echo "UNEXPECTED: $program is installed"; exit 97; fi
        done
        if [ -e /usr/lib/postgresql ]; then echo "UNEXPECTED: /usr/lib/postgresql"; exit 97; fi
        useradd --create-home {USER}
        mkdir {home}/broker
        tar -x -C {home}/broker -f /tree.tar
        chown -R {USER}: {home}/broker
        cd {home}/broker
        exec runuser -u {USER} -- sh -c {shlex.quote(test_command)}
    """


def test_the_readme_test_command_passes_on_a_machine_with_python_only(tmp_path):
    ensure_base_image()
    started = time.monotonic()
    wheels = wheelhouse(tmp_path / "wheels")
    wheels_seconds = time.monotonic() - started
    tree = working_tree(tmp_path / "tree.tar")
    test_command = readme_command("test-command")
    assert test_command.endswith(".venv/bin/pytest"), test_command
    subset_command = f"{test_command} {' '.join(SUBSET)}"

    name = f"broker-python-only-{os.getpid()}"
    started = time.monotonic()
    try:
        # Not run(): its output is wanted whether it passes or not.
        result = subprocess.run(
            [tool("docker"), "run", "--rm", "--name", name, "--network", "none",
             "-v", f"{wheels}:/wheels:ro", "-v", f"{tree}:/tree.tar:ro",
             "-e", "PIP_NO_INDEX=1", "-e", "PIP_FIND_LINKS=/wheels",
             "-e", "PIP_DISABLE_PIP_VERSION_CHECK=1",
             BASE_IMAGE, "sh", "-c", container_script(subset_command)],
            capture_output=True, text=True, timeout=CONTAINER_SECONDS, check=False,
        )  # fmt: skip
    finally:
        subprocess.run([tool("docker"), "rm", "-f", name], capture_output=True, check=False)
    container_seconds = time.monotonic() - started
    output = result.stdout + result.stderr
    print(output[-20000:])  # shown when the test fails

    summary = output.strip().splitlines()[-1]
    assert "UNEXPECTED" not in output
    assert result.returncode == 0, f"exited {result.returncode}: {summary}"
    # The session started its own server: no DATABASE_URL, and no PostgreSQL to find.
    header = re.search(r"^database: PostgreSQL (\d+)\S* on 127\.0\.0\.1:\d+, data directory (.*)$",
                       output, re.MULTILINE)  # fmt: skip
    assert header, "no database line in the test session's header"
    assert header[1] == "18"
    assert EMBEDDED_SERVER_DIRECTORY in header[2]
    assert re.search(r"\d+ passed", summary), summary
    assert not re.search(r"failed|error", summary), summary
    # What the tests of a missing tool say (and REQUIRE_TOOLS, CI's, is not the machine's).
    assert REQUIRE_TOOLS not in output
    assert "apt-get install chromium" in output
    assert "apt-get install openjdk-17-jre-headless" in output
    report(
        "the README's test command with Python only",
        wheels_s=round(wheels_seconds),
        container_s=round(container_seconds),
        pytest_summary=summary.strip("= "),
    )
