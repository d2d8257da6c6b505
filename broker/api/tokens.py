"""Checks of the resources' own tokens (broadcast, pull and DLQ endpoints, docs/api.md).

A missing token is 401, a wrong one 403; every comparison is constant-time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rest_framework import status
from rest_framework.request import Request

from broker.api.errors import ApiError
from broker.tokens import token_matches


class HasToken(Protocol):
    def check_token(self, given: str | None) -> bool: ...


@dataclass(frozen=True)
class StoredToken:
    """A token hash read without its model (the broadcast path reads hashes directly)."""

    token_hash: str

    def check_token(self, given: str | None) -> bool:
        return token_matches(given, self.token_hash)


def require_token(request: Request, header: str, resource: HasToken, what: str) -> None:
    given = request.headers.get(header)
    if not given:
        raise ApiError(status.HTTP_401_UNAUTHORIZED, f"Missing {header}.")
    if not resource.check_token(given):
        raise ApiError(status.HTTP_403_FORBIDDEN, f"{what} token does not match.")
