"""The parser of the API views that take JSON as well as forms (replay, claim): DRF's JSON parser
reading through `broker.storable_text.read_json`, the reader of every JSON body, so a field holding
text that cannot be stored is a 400 naming it there too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from broker.storable_text import read_json


class JsonBodyParser(JSONParser):
    def parse(
        self,
        stream: IO[Any] | None,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        # The body as bytes: JSON is UTF-8 (RFC 8259), json.loads tells UTF-16 and UTF-32 apart,
        # and a charset parameter cannot make it decode otherwise.
        try:
            return read_json(stream.read() if stream is not None else b"")
        except ValueError as exc:  # not JSON (UnicodeDecodeError included)
            raise ParseError(f"JSON parse error - {exc}") from None
