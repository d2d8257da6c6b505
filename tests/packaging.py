"""The broker as a user installs it: a wheel built from this checkout, in a fresh virtualenv.

A host project (docs/outbox.md) installs the wheel and its own database driver only, so that is
what the venv gets; the tests that need the standalone broker's extras add them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tests import ROOT


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def pip_install(self, *requirements: str) -> None:
        run([str(self.python), "-m", "pip", "install", "-q", *requirements])

    def top_level_names(self) -> set[str]:
        with zipfile.ZipFile(self.wheel) as wheel:
            return {name.split("/")[0] for name in wheel.namelist() if ".dist-info/" not in name}

    def files(self) -> list[str]:
        with zipfile.ZipFile(self.wheel) as wheel:
            return wheel.namelist()


def run(command: list[str], cwd: Path | None = None) -> None:
    result = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=900, check=False
    )
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"


def install_wheel(directory: Path) -> Installed:
    """Build the wheel (no dependencies) and install it with `psycopg[binary]` in a new venv."""
    # From a copy of what the package is made of: a build writes into its source directory.
    source = directory / "source"
    for folder in ("broker", "consumers", "jobs", "spark_etl", "templates", "static"):
        # symlinks=True: broker/templates and broker/static stay links, as in a checkout.
        caches = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / folder, source / folder, symlinks=True, ignore=caches)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    dist = directory / "dist"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)])
    (wheel,) = dist.glob("*.whl")
    venv = directory / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    installed = Installed(wheel, venv)
    installed.pip_install(str(wheel), "psycopg[binary]")
    return installed
