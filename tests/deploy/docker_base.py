"""What the `docker` tests share: running the docker commands, and the base image they build on.

No image registry is reachable here, so the base image is a Debian bookworm made by debootstrap
with Python 3.11 and its venv module, and nothing else; it is kept under BASE_IMAGE, so built
once per machine. The Dockerfile builds the broker's image on it
(tests/deploy/test_container_stack.py), and the README's test command runs in it as on a fresh
machine (tests/deploy/test_tests_without_postgres.py).
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests import ROOT

BASE_IMAGE = "broker-base:bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"


def run(*command: str, timeout: float = 600, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a command; fail the test with its output when it fails."""
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
    if result.returncode != 0:
        output = f"{result.stdout[-5000:]}\n{result.stderr[-5000:]}"
        pytest.fail(f"{' '.join(command)} exited {result.returncode}:\n{output}")
    return result


def tool(name: str) -> str:
    """The full path of a command the test needs (.ci/run installs them)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed (apt-get install docker.io docker-compose debootstrap)"
        )
    return path


def image_exists(tag: str) -> bool:
    inspect = subprocess.run(
        [tool("docker"), "image", "inspect", tag], capture_output=True, check=False
    )
    return inspect.returncode == 0


def ensure_base_image() -> None:
    """A Docker daemon that answers, with BASE_IMAGE (built when absent)."""
    if subprocess.run([tool("docker"), "info"], capture_output=True, check=False).returncode:
        pytest.fail("no Docker daemon answers (start dockerd; .ci/run does)")
    if not image_exists(BASE_IMAGE):
        build_base_image()


def build_base_image() -> None:
    """Debian bookworm with python3 and its venv module, from debootstrap, as BASE_IMAGE."""
    with tempfile.TemporaryDirectory(prefix="broker-base-") as root:
        run(
            tool("debootstrap"),
            "--variant=minbase",
            "--include=python3,python3-venv,ca-certificates",
            "bookworm",
            root,
            DEBIAN_MIRROR,
        )
        tar = subprocess.Popen([tool("tar"), "-C", root, "-c", "."], stdout=subprocess.PIPE)
        try:
            run(tool("docker"), "import", "-", BASE_IMAGE, stdin=tar.stdout)
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait(timeout=60)


def working_tree(archive: Path) -> Path:
    """The files of the working tree that git knows of or would add, as they are now."""
    listed = run(
        tool("git"), "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT
    ).stdout.split("\0")
    with tarfile.open(archive, "w") as tar:
        for name in filter(None, listed):
            if (ROOT / name).exists():  # not a tracked file deleted in the working tree
                tar.add(ROOT / name, arcname=name, recursive=False)
    return archive


def copy_of_working_tree(directory: Path) -> Path:
    """The working tree's files (working_tree) in `directory`: images build from it, and what
    a build or the docs' block writes there stays out of the clone."""
    archive = directory.with_suffix(".tar")
    with tarfile.open(working_tree(archive)) as tar:
        tar.extractall(directory, filter="tar")
    archive.unlink()
    return directory
