"""What every group of Admin calls shares: paths, forms, lists, and writes with preconditions."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote, urlencode

import httpx

from webhook_broker_client._http import HttpClient
from webhook_broker_client.errors import NotFound

FORM_TYPE = "application/x-www-form-urlencoded"


def path(*parts: str) -> str:
    """`/part/part/...`, each part quoted: IDs never change the path's shape."""
    return "".join(f"/{quote(part, safe='')}" for part in parts)


def id_of(url: str) -> str:
    """The ID at the end of a resource URL that a list gives (`/channel/c/message/m` -> `m`)."""
    return unquote(url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1])


def form_value(value: Any) -> str:
    """A keyword's value as the broker's form reads it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence):
        return ",".join(str(item) for item in value)
    return str(value)


def form(fields: Mapping[str, Any]) -> dict[str, str]:
    """The fields that were given (None: left out, so the broker keeps or defaults them)."""
    return {name: form_value(value) for name, value in fields.items() if value is not None}


class AdminBase:
    """Holds the admin's HTTP client; the groups of calls (mixins) build on these helpers."""

    _http: HttpClient

    def _get(self, url: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._http.request("GET", url, params=params).json()

    def _list(
        self,
        url: str,
        params: Mapping[str, Any] | None = None,
        result_key: str = "Result",
        pages_key: str = "Pages",
    ) -> Iterator[Any]:
        """Every item of a paginated list, following `next` links until a page is empty."""
        next_url: str | None = url
        while next_url:
            page = self._get(next_url, params)
            items = page.get(result_key) or []
            if not items:
                return
            yield from items
            link = (page.get(pages_key) or {}).get("next")
            next_url = self._http.resolve_link(link) if link else None
            params = None  # the links carry the query of the first request

    def _ids(self, url: str, params: Mapping[str, Any] | None = None, **keys: str) -> Iterator[str]:
        return (id_of(item) for item in self._list(url, params, **keys))

    def _send_form(
        self, method: str, url: str, fields: Mapping[str, Any], headers: Mapping[str, str]
    ) -> httpx.Response:
        body = urlencode(form(fields)).encode()
        return self._http.request(
            method, url, content=body, headers={"Content-Type": FORM_TYPE, **headers}
        )

    def _current(self, url: str) -> tuple[dict[str, str], Any]:
        """If-Unmodified-Since for a change of `url` as it is now, and its JSON; ({}, None) when
        it does not exist.

        The broker needs the header to update or delete a resource (docs/api.md, "Management
        writes"). Read just before the write, so a change by someone else in between is a 412.
        """
        try:
            current = self._http.request("GET", url)
        except NotFound:
            return {}, None
        return {"If-Unmodified-Since": current.headers["Last-Modified"]}, current.json()

    def _put(self, url: str, fields: Mapping[str, Any]) -> Any:
        """Create or update: the form's fields; those left out keep their values."""
        return self._send_form("PUT", url, fields, self._current(url)[0]).json()

    def _delete(self, url: str) -> None:
        headers, _ = self._current(url)
        if not headers:
            raise NotFound(404, f"{url} does not exist")
        self._http.request("DELETE", url, headers=headers)

    def _post(self, url: str, fields: Mapping[str, Any] | None = None) -> Any:
        """A command (pause, rotate, replay, requeue): never retried, it may not be repeatable."""
        if fields is None:
            response = self._http.request("POST", url)
        else:
            response = self._send_form("POST", url, fields, {})
        return response.json() if response.content else None
