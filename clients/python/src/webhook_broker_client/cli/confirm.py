"""Questions before destructive commands: asked on stderr, skipped with --yes."""

from __future__ import annotations

import click

from webhook_broker_client.cli.output import note

EXIT_NOT_CONFIRMED = 1


def confirm_or_stop(question: str, yes: bool) -> None:
    """Return when confirmed (or `yes`); otherwise exit 1 having changed nothing.

    Without a terminal to answer on (a script, a pipe) the answer is no: a script must say
    --yes to destroy anything.
    """
    if yes:
        return
    try:
        confirmed = click.confirm(question, default=False, err=True)
    except click.Abort:
        confirmed = False
    if not confirmed:
        note("Nothing done (not confirmed; --yes skips the question).")
        raise click.exceptions.Exit(EXIT_NOT_CONFIRMED)
