"""tests/tools.py: a test that needs an absent system tool skips, naming what to install, unless
BROKER_TESTS_REQUIRE_TOOLS=1 (CI), where the absence fails it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import tools

ABSENT = tools.Tool("the frobnicator", "apt-get install frobnicator", lambda: None)
PRESENT = tools.Tool("a shell", "apt-get install dash", lambda: Path("/bin/sh"))


@pytest.fixture(autouse=True)
def made_up_tools(monkeypatch):
    monkeypatch.setitem(tools.TOOLS, "frobnicator", ABSENT)
    monkeypatch.setitem(tools.TOOLS, "shell", PRESENT)
    monkeypatch.delenv(tools.REQUIRE_TOOLS, raising=False)
    tools.find_tool.cache_clear()
    yield
    tools.find_tool.cache_clear()


def test_a_present_tool_is_its_path():
    assert tools.require_tool("shell") == Path("/bin/sh")


def test_an_absent_tool_skips_the_test_naming_what_to_install():
    with pytest.raises(pytest.skip.Exception, match="the frobnicator: apt-get install frobnicator"):
        tools.require_tool("frobnicator")


def test_under_require_tools_an_absent_tool_fails_the_test(monkeypatch):
    monkeypatch.setenv(tools.REQUIRE_TOOLS, "1")
    with pytest.raises(pytest.fail.Exception, match="BROKER_TESTS_REQUIRE_TOOLS=1 and the frob"):
        tools.require_tool("frobnicator")


def marked(*names: str) -> Any:
    """A stand-in for a test item with `needs_tool(*names)` among its marks."""
    marks = [pytest.mark.needs_tool(*names).mark, pytest.mark.django_db.mark]
    return SimpleNamespace(iter_markers=lambda name: [m for m in marks if m.name == name])


def test_the_mark_requires_every_tool_it_names():
    tools.require_marked_tools(marked("shell"))
    with pytest.raises(pytest.skip.Exception, match="frobnicator"):
        tools.require_marked_tools(marked("shell", "frobnicator"))


def test_a_mark_naming_an_unknown_tool_fails():
    with pytest.raises(pytest.fail.Exception, match="no such tool"):
        tools.require_marked_tools(marked("chromium-typo"))


def test_the_real_tools_say_how_to_install_them():
    for tool in tools.TOOLS.values():
        assert tool.install.startswith(("apt-get install", "pip install"))
