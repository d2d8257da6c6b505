"""The broker's log format: plain text lines, or one JSON object a line (BROKER_LOG_FORMAT).

Both formats carry the same records to standard error. The broker's own lines pass their fields
with `extra=` (a delivery's job, consumer and outcome; a request's status and duration): with json
they are keys of the object, so a log pipeline reads them without parsing the message; with text
the message says them as `key=value`. The lines and their fields: docs/observability.md.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from broker.settings_catalog import LOG_FORMATS as LOG_FORMATS  # declared with the setting

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def logging_config(log_format: str, level: str) -> dict[str, Any]:
    """Django's LOGGING for `log_format` ("text" or "json") at `level`."""
    formatter: dict[str, Any] = (
        {"()": "broker.logs.json_formatter"} if log_format == "json" else {"format": TEXT_FORMAT}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"broker": formatter},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "broker"}},
        "root": {"handlers": ["console"], "level": level},
    }


def json_formatter() -> logging.Formatter:
    """python-json-logger's formatter: `timestamp` (ISO 8601, UTC), `level`, `logger`,
    `message`, then every field given with `extra=` (and `exc_info` for a traceback) but
    Django's `request`.

    Django's loggers pass the request object itself (`django.request`'s "Unauthorized: /path"
    lines, `django.server`): as a key it would be its repr, which has the full path, query
    string included, where a client may have put a token. The message names the path alone.
    """
    # Imported here: text logs (the default) never load it.
    from pythonjsonlogger.core import RESERVED_ATTRS
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        ["levelname", "name", "message"],
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp=True,
        reserved_attrs=[*RESERVED_ATTRS, "request"],
    )


def one_line(text: str) -> str:
    """`text` with its control characters (line breaks above all) replaced: what a peer sent
    (an error message, a path) can never start a forged line of a text log."""
    return _CONTROL.sub("\ufffd", text)
