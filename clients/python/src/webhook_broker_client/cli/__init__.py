"""The `webhook-broker` command line (clients/python/README.md, "Command line").

Each command talks to the broker only through the package's clients (Admin, Producer), so it
gets their errors and their retry rule; this package adds the options, the output and the exit
codes.
"""

from __future__ import annotations

from webhook_broker_client.cli.app import cli
from webhook_broker_client.cli.consumers import consumers
from webhook_broker_client.cli.dlq import dlq
from webhook_broker_client.cli.messages import messages
from webhook_broker_client.cli.publish import publish
from webhook_broker_client.cli.pull import pull
from webhook_broker_client.cli.resources import channels, producers
from webhook_broker_client.cli.seed import seed
from webhook_broker_client.cli.status import status
from webhook_broker_client.cli.tail import tail

__all__ = ["cli", "main"]

for command in (status, channels, producers, consumers, publish, messages, dlq, tail, seed, pull):
    cli.add_command(command)


def main() -> None:
    """The console script's entry point."""
    cli(prog_name="webhook-broker")
