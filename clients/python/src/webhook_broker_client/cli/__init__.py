"""The `webhook-broker` command line (clients/python/README.md, "Command line").

Each command talks to the broker only through the package's clients (Admin, Producer), so it
gets their errors and their retry rule; this package adds the options, the output and the exit
codes.
"""

from __future__ import annotations

from webhook_broker_client.cli.app import cli
from webhook_broker_client.cli.publish import publish

__all__ = ["cli", "main"]

cli.add_command(publish)


def main() -> None:
    """The console script's entry point."""
    cli(prog_name="webhook-broker")
