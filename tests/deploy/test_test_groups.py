"""The test command's groups (tests/conftest.py, `--dist loadgroup`) hold: pytest-xdist sends a
group to one worker by the `@group` it appends to each nodeid, and a pytest release that drops it
(9.2 does) would split every group silently: a JVM per worker, races for fixed ports."""

import pytest


@pytest.mark.xdist_group("test-groups")
def test_a_grouped_test_carries_its_group_to_the_scheduler(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under pytest-xdist's --dist loadgroup (the test command's default)")
    assert request.node.nodeid.endswith("@test-groups"), (
        "pytest-xdist's group is missing from the nodeid: pin a pytest that keeps it"
    )
