"""The soak of bench/soak.py, shortened to a minute (issue 9): steady HTTP broadcasts to push and
pull consumers together, two dispatchers, gunicorn; no job lost or left undelivered, and no
process's memory growing. The 10-minute figures are in docs/reliability.md."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.faults import report
from tests.processes import ROOT

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
SOAK = ["bench/soak.py", "--seconds", "60", "--rate", "20", "--sample-seconds", "5"]


def test_a_short_soak_loses_nothing_and_memory_stays_flat():
    run = subprocess.run(
        [sys.executable, *SOAK],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    figures = [line.strip() for line in run.stdout.splitlines() if "lost" in line or "p99" in line]
    report("soak (60 s, 20 messages/s)", summary=" | ".join(figures))
