"""Text the broker can store, and the one reader of the JSON clients send (docs/api.md, "Errors").

Two kinds of character cannot be stored, and a request holding one is refused where it is read,
with a 400 naming the field (`UnstorableText`), before anything changes:

* a lone surrogate (U+D800 to U+DFFF, not in a pair): not Unicode text, so it has no UTF-8
  encoding, and neither PostgreSQL nor a payload's bytes can hold it. JSON writes one as an escape
  (`"\\ud800"`), which Python's decoder turns into exactly such a character. Forms and URLs never
  carry one: they are read as UTF-8 (broker/utf8_requests.py), which has none.
* NUL (U+0000): Unicode, but PostgreSQL text and jsonb cannot hold it. A field whose text becomes
  bytes (a batch item's `payload`) may carry it: the caller names those fields (`binary`).

Every JSON request body, and every form value holding JSON (a schema, metadata headers), is read
by `read_json`; the admin's JSON fields are `StorableJSONField`s, which check what Django's field
decoded. `read_json` walks the decoded document only when the text holds a `\\u` escape or a raw
surrogate: the common body costs one substring search more than `json.loads` (16 MB: 14 ms for
`json.loads`, 20 ms in all).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

# Keys shown as they are in a field's name; any other is shown as a JSON string (ASCII only).
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,99}\Z")
MAX_NAME_CHARS = 300  # of a field's name in an error


class UnstorableText(Exception):
    """A field (`where`, e.g. `messages[2].payload`) holds text the broker cannot store."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where} {problem}")
        self.where = where
        self.problem = problem


def unstorable_character(text: str, *, nul_allowed: bool = False) -> str | None:
    """Why `text` cannot be stored, or None when it can. Each test is one pass in C: payloads of
    megabytes go through here."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as error:  # UTF-8 encodes everything but surrogates
            code = f"U+{ord(text[error.start]):04X}"
            return f"holds a lone surrogate ({code}), which is not text and cannot be stored."
    if not nul_allowed and "\x00" in text:
        return "holds a NUL character (U+0000), which cannot be stored in text."
    return None


def read_json(data: bytes | str, *, root: str = "", binary: Collection[str] = frozenset()) -> Any:
    """The JSON document in `data`, as `json.loads` reads it (ValueError when it is not JSON,
    NaN and Infinity included); UnstorableText naming a field that holds text the broker cannot
    store.

    Fields are named from `root` (`""` for a request body: `messages[2].payload`; `"$"` for a form
    value: `$.items[0]`). `binary` names the fields that may hold NUL, each index written `[]`
    (`messages[].payload`).
    """
    if isinstance(data, str):
        text, may_be_unstorable = data, "\\u" in data or unstorable_character(data) is not None
    else:
        text, may_be_unstorable = _decoded(data)
    document = json.loads(text, parse_constant=_not_json)
    if may_be_unstorable:
        check_document(document, root=root, binary=binary)
    return document


def _decoded(data: bytes) -> tuple[str, bool]:
    """The text of a JSON body, decoded as json.loads decodes it, and whether it may hold an
    unstorable character: a surrogate written raw (json.loads lets one through: it decodes
    with "surrogatepass") or any \\u escape (raw NUL is no JSON: strings cannot hold it)."""
    encoding = json.detect_encoding(data)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError:  # a raw surrogate, or no text at all (raised again then)
        return data.decode(encoding, "surrogatepass"), True
    return text, "\\u" in text


def _not_json(constant: str) -> Any:
    # NaN and Infinity are Python's extensions, not JSON (RFC 8259), and no field takes them.
    raise ValueError(f"{constant} is not a JSON value")


def check_document(
    document: Any, *, root: str = "$", binary: Collection[str] = frozenset()
) -> None:
    """UnstorableText naming a field of a decoded JSON document that holds text the broker
    cannot store (`read_json`'s check, for a document decoded elsewhere: a form's JSON field).
    Fields are looked at in document order, each object's names before its values."""
    # Iterative: a document nested as deep as json.loads allows must not overflow the stack here.
    # Each entry: a value, its field's name, and that name with every index written "[]".
    pending: list[tuple[Any, str, str]] = [(document, root, root)]
    while pending:
        value, where, template = pending.pop()
        if isinstance(value, str):
            problem = unstorable_character(value, nul_allowed=template in binary)
            if problem:
                raise UnstorableText(_shown(where), problem)
        elif isinstance(value, dict):
            children = []
            for key, item in value.items():
                name = _child(where, key)
                problem = unstorable_character(key)
                if problem:
                    raise UnstorableText(_shown(name), f"has a name that {problem}")
                children.append((item, name, _child(template, key)))
            pending.extend(reversed(children))  # popped in document order
        elif isinstance(value, list):
            pending.extend(
                (item, f"{where}[{index}]", f"{template}[]")
                for index, item in reversed(list(enumerate(value)))
            )


def _child(where: str, key: str) -> str:
    if _PLAIN_KEY.match(key):
        return f"{where}.{key}" if where else key
    return f"{where}[{json.dumps(key[:100])}]"  # ensure_ascii: "\ud800", never the character


def _shown(where: str) -> str:
    where = where or "The body"
    return where if len(where) <= MAX_NAME_CHARS else where[: MAX_NAME_CHARS - 1] + "…"


class StorableJSONField(forms.JSONField):
    """Django's form field for JSON, refusing what the database cannot store, with the place
    named: every JSON field of the admin's forms (broker/admin.py, `STORABLE_JSON`)."""

    def to_python(self, value: Any) -> Any:
        document = super().to_python(value)
        try:
            check_document(document)
        except UnstorableText as error:
            raise ValidationError(str(error), code="unstorable") from None
        return document
