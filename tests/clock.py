"""Whether this test run's clock was moved ahead (`--clock-ahead-days`, tests/conftest.py).

Moving the test process's clock shows that no test depends on today's date. The processes a test
starts (dispatchers, servers, the housekeeping cluster) still read the real clock, so a test that
starts one is skipped in such a run: its processes and the test would disagree about what is due.
"""

from __future__ import annotations

import pytest

moved_ahead = False


def skip_if_moved() -> None:
    if moved_ahead:
        pytest.skip("starts a process on the real clock while this run's clock is moved ahead")
