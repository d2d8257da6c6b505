"""The tables of docs/configuration.md, generated from the declarations: one per section, between
`<!-- settings: SECTION -->` and `<!-- /settings -->`. `python -m broker.settings_catalog
docs/configuration.md` rewrites them, `--check` only compares (CI runs it)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from broker.settings_catalog.broker_settings import BrokerSettings
from broker.settings_catalog.server_environment import ServerEnvironment
from broker.settings_catalog.setting import Setting

# A generated table sits between `<!-- settings: SECTION -->` and `<!-- /settings -->`.
_GENERATED = re.compile(r"(<!-- settings: ([a-z-]+) -->\n).*?(<!-- /settings -->)", re.DOTALL)


def declared_settings() -> list[Setting[Any]]:
    """Every setting, in the order of the tables (a section's rows follow their declarations)."""
    return BrokerSettings.declared() + ServerEnvironment.declared()


def markdown_table(section: str) -> str:
    rows = [
        "| variable | default | meaning |",
        "|---|---|---|",
        *(_markdown_row(s) for s in declared_settings() if s.section == section),
    ]
    return "\n".join(rows) + "\n"


def _markdown_row(setting: Setting[Any]) -> str:
    variable = f"`{setting.name}`"
    if setting.secret:
        variable += f" / `{setting.name}_FILE`"
    meaning = setting.meaning
    if bounds := setting.kind.bounds():
        meaning += f"; {bounds}"
    return f"| {variable} | {_shown_default(setting)} | {meaning} |"


def _shown_default(setting: Setting[Any]) -> str:
    if setting.shown_default is not None:
        return setting.shown_default
    value = setting.default
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        value = ",".join(str(item) for item in value)
    return f"`{value}`" if value != "" else "empty"


def with_generated_tables(document: str) -> str:
    """The document with every generated table rewritten from the declarations."""
    return _GENERATED.sub(
        lambda match: match.group(1) + markdown_table(match.group(2)) + match.group(3), document
    )


def generated_sections(document: str) -> Iterator[str]:
    return (match.group(2) for match in _GENERATED.finditer(document))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m broker.settings_catalog",
        description="Rewrite the generated settings tables of a Markdown file (or check them).",
    )
    parser.add_argument("document", type=Path, help="e.g. docs/configuration.md")
    parser.add_argument("--check", action="store_true", help="only report whether it is current")
    options = parser.parse_args(argv)
    current = options.document.read_text()
    generated = with_generated_tables(current)
    if generated == current:
        return 0
    if options.check:
        print(f"{options.document} is out of date: run {parser.prog} {options.document}")
        return 1
    options.document.write_text(generated)
    print(f"{options.document} rewritten")
    return 0
