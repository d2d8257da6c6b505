"""The `webhook-broker` group: global options, and one place that turns failures into exit codes.

Exit codes (clients/python/README.md): 0 done; 1 refused (the broker said no: not found, a bad
request, a wrong token, a conflict; or a question answered no); 2 usage (click's: a bad flag, a
missing argument or setting); 3 the broker could not be reached, or failed (5xx), after the
client's retries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from webhook_broker_client._http import __version__
from webhook_broker_client.cli.output import error
from webhook_broker_client.cli.settings import TOKEN_VARIABLE, URL_VARIABLE, Settings
from webhook_broker_client.errors import BrokerError, BrokerUnavailable, ServerError

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3

Command = TypeVar("Command", bound=Callable[..., Any])


class BrokerGroup(click.Group):
    """A group whose commands may raise BrokerError: shown on stderr, then the exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokerError as failure:
            error(str(failure))
            ctx.exit(exit_code_for(failure))


def exit_code_for(failure: BrokerError) -> int:
    if isinstance(failure, BrokerUnavailable | ServerError):
        return EXIT_UNAVAILABLE
    return EXIT_REFUSED


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(Settings).json = True


def json_option(command: Command) -> Command:
    """`--json` on a command too, so it may follow the command's name (`channels list --json`)."""
    return click.option(
        "--json",
        "json_output",
        is_flag=True,
        expose_value=False,
        callback=_set_json,
        help="Print JSON on stdout instead of tables.",
    )(command)


@click.group(cls=BrokerGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    envvar=URL_VARIABLE,
    show_envvar=True,
    metavar="URL",
    help="The broker's address, e.g. http://127.0.0.1:8000.",
)
@click.option(
    # Not --token: the put commands' --token is the resource's own token.
    "--admin-token",
    envvar=TOKEN_VARIABLE,
    show_envvar=True,
    metavar="TOKEN",
    help="An admin token (BROKER_ADMIN_TOKENS, or an API key).",
)
@click.option(
    "--json",
    "json_output",
    is_flag=True,
    help="Print JSON on stdout instead of tables (errors stay on stderr).",
)
@click.version_option(__version__, prog_name="webhook-broker")
@click.pass_context
def cli(ctx: click.Context, url: str | None, admin_token: str | None, json_output: bool) -> None:
    """Manage and use a webhook broker from the command line.

    Exit codes: 0 done, 1 refused by the broker (or not confirmed), 2 usage, 3 broker
    unreachable or failing.
    """
    settings = ctx.ensure_object(Settings)
    settings.url = url.rstrip("/") if url else None
    settings.admin_token = admin_token
    settings.json = settings.json or json_output
