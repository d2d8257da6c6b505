"""What the command line prints: tables for people, JSON for scripts, errors on stderr.

With `--json`, stdout carries exactly one JSON document per command (a `tail` prints one per
line, as it goes) and nothing else; everything said to a person (progress, questions, errors)
goes to stderr, so `webhook-broker --json … | jq` always reads clean JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from webhook_broker_client.cli.settings import current_settings

# Piped output is read by programs or saved: wide enough that rows of IDs and times do not fold.
PIPED_WIDTH = 160
NONE_SHOWN = "-"


def stdout_console() -> Console:
    width = None if sys.stdout.isatty() else PIPED_WIDTH
    return Console(highlight=False, width=width, soft_wrap=False)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def emit(data: Any, human: Callable[[Console], None]) -> None:
    """`data` as JSON with --json; otherwise what `human` prints."""
    if current_settings().json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        human(stdout_console())


def emit_line(data: Any, human: str) -> None:
    """One event of a stream (tail): a JSON object on one line, or a line of text."""
    if current_settings().json:
        click.echo(json.dumps(data, ensure_ascii=False))
    else:
        stdout_console().print(human, markup=False)
    sys.stdout.flush()


def note(text: str) -> None:
    """Something for the person at the terminal, never part of the output: stderr."""
    stderr_console().print(text, markup=False)


def error(text: str) -> None:
    stderr_console().print(f"error: {text}", markup=False, style="red")


def shown(value: Any) -> str:
    """A field as a table cell: lists joined, None and empty shown as a dash."""
    if value is None or value == "" or value == []:
        return NONE_SHOWN
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(shown(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    grid = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in columns:
        grid.add_column(column, overflow="fold")
    for row in rows:
        grid.add_row(*(shown(cell) for cell in row))
    return grid


def record(title: str | None, fields: Sequence[tuple[str, Any]]) -> Table:
    """One object as a two-column table of field and value."""
    grid = Table(title=title, title_justify="left", show_header=False, show_edge=False)
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for name, value in fields:
        grid.add_row(name, shown(value))
    return grid


def fields_of(data: dict[str, Any], names: Sequence[str]) -> list[tuple[str, Any]]:
    """The named fields of an API object, in that order, then any others it has."""
    ordered = [(name, data[name]) for name in names if name in data]
    return ordered + [(name, value) for name, value in data.items() if name not in names]
