"""Validation of everything the operator UI reads from a request, before it reaches the database.

Query parameters are read through Django forms built from the fields here, path segments are
checked by `check_path` (called by `ui.access.operator_view` for every view), and a value that
fails becomes `BadInput`, which that decorator answers with a 400 page naming the parameter.

What the checks guard against: PostgreSQL text cannot hold NUL; Python datetimes end at year
9999, so a date near either end overflows when converted to UTC or moved by a period; keys
beyond a bigint, or cursors edited by hand, must be refused, not sent to the database.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from broker.models import validate_message_id, validate_resource_id
from broker.xids import LARGEST_KEY, key_of_xid

# Dates a filter or a schedule may name. Nothing the broker stores is older than the first, and
# the second is far enough from year 9999 that a time zone or a report period added to it
# cannot overflow.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
MAX_PRIMARY_KEY = LARGEST_KEY
TEXT_LENGTH = 1000  # free text, such as the error a dead jobs filter searches for


class BadInput(Exception):
    """Request parameters the UI refuses, each with the reason: a 400 page lists them."""

    def __init__(self, problems: Mapping[str, str]) -> None:
        super().__init__("; ".join(f"{name}: {problem}" for name, problem in problems.items()))
        self.problems = dict(problems)


def bad(parameter: str, problem: str) -> BadInput:
    return BadInput({parameter: problem})


def valid(form: forms.Form) -> dict[str, Any]:
    """The form's cleaned data, or BadInput naming every field that failed."""
    if not form.is_valid():
        raise BadInput({name: " ".join(map(str, errors)) for name, errors in form.errors.items()})
    return form.cleaned_data


# Values


def resource_id(text: str) -> str:
    """A channel, producer, consumer or periodic message ID; ValueError otherwise."""
    return _checked(validate_resource_id, text)


def message_id(text: str) -> str:
    return _checked(validate_message_id, text)


def primary_key(text: str) -> int:
    """An internal id: ASCII digits (int() would also take "٣" or " 7"), within a bigint."""
    if not (text.isascii() and text.isdigit()):
        raise ValueError("Give a whole number.")
    # The length first: int() raises an error of its own beyond 4300 digits.
    if len(text) > len(str(MAX_PRIMARY_KEY)) or not 1 <= int(text) <= MAX_PRIMARY_KEY:
        raise ValueError(f"Give a number from 1 to {MAX_PRIMARY_KEY}.")
    return int(text)


def job_id(text: str) -> str:
    """A job's public ID (an xid, Job.public_id)."""
    if key_of_xid(text) is None:
        raise ValueError("Give a job ID: 20 characters of 0-9 and a-v.")
    return text


def action_id(text: str) -> str:
    """A requeue's or delete's ID, as its page's URL has it (an xid, DeadLetterAction.public_id)."""
    if key_of_xid(text) is None:
        raise ValueError("Give an action ID: 20 characters of 0-9 and a-v.")
    return text


def moment(text: str) -> datetime:
    """An ISO 8601 date-time with its offset, as a cursor carries it; within the allowed range."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError("Give an ISO 8601 date and time.") from None
    if value.tzinfo is None:
        raise ValueError("Give the time with its UTC offset.")
    return in_range(value)


def in_range(value: datetime) -> datetime:
    """`value` (aware) if it lies from EARLIEST to before LATEST; ValueError otherwise.

    Comparing aware datetimes converts neither to UTC, so this check itself cannot overflow.
    """
    if not EARLIEST <= value < LATEST:
        raise ValueError(f"Give a time from {EARLIEST:%Y-%m-%d} to before {LATEST:%Y-%m-%d}.")
    return value


def _checked(validator: Callable[[str], None], text: str) -> str:
    try:
        validator(text)
    except ValidationError as error:
        raise ValueError(" ".join(error.messages)) from None
    return text


# Form fields (CharField already refuses NUL)


class IdField(forms.CharField):
    """A resource ID (channel, consumer, …), optional unless said otherwise."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(max_length=255, validators=[validate_resource_id], **kwargs)


class TextField(forms.CharField):
    """Free text of bounded length, optional unless said otherwise."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("max_length", TEXT_LENGTH)
        super().__init__(**kwargs)


class MomentField(forms.DateTimeField):
    """A date-time, read as UTC without an offset, refused outside EARLIEST to LATEST."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def clean(self, value: Any) -> datetime | None:
        cleaned: datetime | None = super().clean(value)
        if cleaned is None:
            return None
        try:
            return in_range(cleaned)
        except ValueError as error:
            raise ValidationError(str(error)) from None


class ChannelChoice(forms.Form):
    """The channel a "new" form starts with (from a link on one channel's list)."""

    channel = IdField()


class CursorField(forms.CharField):
    """A keyset cursor, parsed by `parse` (ui.paging.Keyset.parse) into a position; a cursor
    that does not parse is refused rather than silently ignored."""

    def __init__(self, parse: Callable[[str], tuple[Any, Any]], **kwargs: Any) -> None:
        self.parse = parse
        kwargs.setdefault("required", False)
        super().__init__(max_length=TEXT_LENGTH, **kwargs)

    def clean(self, value: Any) -> tuple[Any, Any] | None:
        text: str = super().clean(value)
        if not text:
            return None
        try:
            return self.parse(text)
        except ValueError:
            raise ValidationError(
                "This page link is damaged; start again from the first page."
            ) from None


# Path segments


# Every name a UI route gives a path segment, with how its value is checked.
PATH_SEGMENTS: dict[str, Callable[[str], Any]] = {
    "channel_id": resource_id,
    "consumer_id": resource_id,
    "periodic_id": resource_id,
    "message_id": message_id,
    "job_id": job_id,
    "message_pk": primary_key,
    "action_id": action_id,
}


def check_path(segments: Mapping[str, object]) -> None:
    """Refuse path segments that cannot name anything (BadInput); a route using a name missing
    from PATH_SEGMENTS is a programming error (KeyError), caught by tests/ui/test_fuzz.py."""
    problems = {}
    for name, value in segments.items():
        try:
            PATH_SEGMENTS[name](str(value))
        except ValueError as error:
            problems[name] = str(error)
    if problems:
        raise BadInput(problems)


# Form fields of actions


def job_keys(values: list[str], parameter: str) -> list[int]:
    """The row keys of the jobs ticked in a list (a checkbox per row holds a job's public ID)."""
    keys = []
    for value in values:
        parts = key_of_xid(value)
        if parts is None:
            raise bad(parameter, f"{value[:40]!r} is not a job ID.")
        keys.append(parts[1])
    return keys


def is_ui_path(path: str) -> bool:
    """Whether `path` is one of the UI's pages."""
    return path.startswith(reverse("ui:dashboard"))


def is_local_url(target: str, host: str) -> bool:
    """Whether a redirect to `target` stays on this site, and is a URL a header can carry."""
    if not target.isprintable():  # a line break would be refused by the Location header
        return False
    return url_has_allowed_host_and_scheme(target, {host})
