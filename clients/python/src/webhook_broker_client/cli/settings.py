"""Where the command line finds the broker and its credentials: flags, else the environment.

Every command reads them through `Settings`, so a missing one is always the same usage error
(exit 2) naming both the flag and the variable.
"""

from __future__ import annotations

from dataclasses import dataclass

import click

from webhook_broker_client.admin import Admin

URL_VARIABLE = "WEBHOOK_BROKER_URL"
TOKEN_VARIABLE = "WEBHOOK_BROKER_TOKEN"  # noqa: S105 - a name, not a secret
CHANNEL_TOKEN_VARIABLE = "WEBHOOK_BROKER_CHANNEL_TOKEN"  # noqa: S105 - a name, not a secret
PRODUCER_ID_VARIABLE = "WEBHOOK_BROKER_PRODUCER_ID"
PRODUCER_TOKEN_VARIABLE = "WEBHOOK_BROKER_PRODUCER_TOKEN"  # noqa: S105 - a name, not a secret
CONSUMER_TOKEN_VARIABLE = "WEBHOOK_BROKER_CONSUMER_TOKEN"  # noqa: S105 - a name, not a secret


@dataclass
class Settings:
    """The group's options, shared by every command through click's context object."""

    url: str | None = None
    admin_token: str | None = None
    json: bool = False

    def broker_url(self) -> str:
        return required(self.url, "--url", URL_VARIABLE, "the broker's address")

    def required_admin_token(self) -> str:
        return required(self.admin_token, "--admin-token", TOKEN_VARIABLE, "an admin token")


def required(value: str | None, flag: str, variable: str, what: str) -> str:
    """`value`, or a usage error saying how to give it."""
    if not value:
        raise click.UsageError(f"{what} is needed: give {flag} or set {variable}")
    return value


def current_settings() -> Settings:
    """The Settings of the command being run (made by the group)."""
    return click.get_current_context().ensure_object(Settings)


def admin_client() -> Admin:
    """The admin client for the configured broker and token."""
    settings = current_settings()
    return Admin(settings.broker_url(), settings.required_admin_token())
