"""Consumer settings and controls, shared by the REST API (consumers/api.py), the operator UI
(broker/ui/consumer_forms.py, consumer_pages.py) and the admin (consumers/admin.py): one validation
of the settings, one way to save them, pause, resume, close a circuit and rotate a secret,
whichever door the request came through.

Each setting is declared once (`SETTINGS`, a `ConsumerSetting`): its name in the API, its model
field, how its form text is parsed and bounded (the validators below, which raise `InvalidSetting`
with a message fit to show next to the field), and how its value is written back as form text.
The API's serializer fields and the UI's and admin's form fields are built on these
declarations: a rule is written here, nowhere else. A control of a consumer that does not exist
raises `ConsumerNotFound`, which each door answers with its own 404.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

from django import forms
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from broker import event_types
from broker.models import Channel
from broker.parsing import parse_int
from broker.stakeholders import apply_stakeholder_form
from consumers.callback_url import masked_callback_url, validate_callback_url
from consumers.models import Consumer
from consumers.safety import UnsafeCallback, check_callback_url
from jobs.queue import circuit, restart_age
from jobs.signing import InvalidSecret, decode_secret

T = TypeVar("T")

MAX_RETRIES = 50
MAX_RETRY_DELAY_SECONDS = 7 * 86400
MAX_JOB_AGE_SECONDS = 365 * 86400
MAX_CALLBACK_URL_LENGTH = 2048  # the model field's
MAX_SECRET_LENGTH = 256
# A delivery rate limit's bounds: above the highest it is no limit; below the lowest (one
# request in about 17 minutes) slots would be booked so far ahead that times overflow.
LOWEST_PER_SECOND, HIGHEST_PER_SECOND = 0.001, 100000


class InvalidSetting(ValueError):
    """A consumer setting that cannot be accepted; str() is the message for the user."""


class ConsumerNotFound(LookupError):
    """No consumer with this ID in this channel (or no such channel)."""

    def __init__(self, channel_id: str, consumer_id: str) -> None:
        super().__init__(f"No consumer {consumer_id!r} in channel {channel_id!r}.")


# Validation of the settings (docs/api.md extensions, docs/reliability.md callback safety)


def validated(validator: Callable[[str], T], value: str) -> T:
    """The validator's result; its refusal as Django's ValidationError, which a form's
    clean_<field> and a DRF serializer's validate_<field> both show as an error of the field."""
    try:
        return validator(value)
    except InvalidSetting as error:
        raise ValidationError(str(error)) from None


def checked_callback_url(value: str) -> str:
    """An absolute http(s) URL whose host the address guard allows (consumers/safety.py)."""
    try:
        validate_callback_url(value)
    except ValidationError as error:
        raise InvalidSetting(error.messages[0]) from None
    try:
        check_callback_url(value)
    except UnsafeCallback as exc:
        raise InvalidSetting(exc.message) from None
    return value


def checked_new_callback_url(value: str, current: str) -> str:
    """A callback URL typed into a form that shows the current one masked (the UI's and the
    admin's edit forms): blank keeps the current one (""); the masked text copied back is refused,
    for saving it would put MASK where the secrets were; anything else as checked_callback_url."""
    if not value:
        return ""
    if value == masked_callback_url(current) != current:
        raise InvalidSetting(
            "This is the current URL with its secrets masked: type the whole new URL, or leave "
            "the field blank to keep the current one."
        )
    return checked_callback_url(value)


def parse_retry_delays(value: str) -> list[int] | None:
    """Seconds before each retry; None (blank) means the global BROKER_RETRY_DELAYS."""
    delays = _int_list(value, low=0, high=MAX_RETRY_DELAY_SECONDS, what="retryDelays")
    if len(delays) > MAX_RETRIES:
        raise InvalidSetting(f"retryDelays: at most {MAX_RETRIES} entries.")
    return delays if value.strip() else None


def parse_non_retryable_statuses(value: str) -> list[int]:
    return _int_list(value, low=100, high=599, what="nonRetryableStatuses")


def parse_max_in_flight(value: str) -> int | None:
    """The per-consumer concurrency cap; None (blank) means the dispatcher's default."""
    if not value.strip():
        return None
    numbers = _int_list(value, low=1, high=100000, what="maxInFlight")
    if len(numbers) != 1:
        raise InvalidSetting("maxInFlight: one integer.")
    return numbers[0]


def parse_max_job_age(value: str) -> int | None:
    """Seconds a push job may wait undelivered before it expires (jobs/queue/expiry.py); None
    (blank)
    means BROKER_MAX_JOB_AGE_SECONDS, 0 no limit."""
    if not value.strip():
        return None
    numbers = _int_list(value, low=0, high=MAX_JOB_AGE_SECONDS, what="maxJobAge")
    if len(numbers) != 1:
        raise InvalidSetting("maxJobAge: one integer (seconds).")
    return numbers[0]


def parse_max_per_second(value: str) -> float | None:
    """The delivery rate limit (docs/delivery.md, "Rate limit"): push requests per second, a
    decimal number from LOWEST_PER_SECOND to HIGHEST_PER_SECOND (0.5: one every two seconds); None
    (blank) means no limit."""
    if not value.strip():
        return None
    try:
        rate = Decimal(value.strip())
    except InvalidOperation:
        rate = Decimal("NaN")
    if not rate.is_finite() or not LOWEST_PER_SECOND <= rate <= HIGHEST_PER_SECOND:
        raise InvalidSetting(
            f"maxPerSecond: a decimal number from {LOWEST_PER_SECOND} to {HIGHEST_PER_SECOND}"
            " (requests per second), or blank for no limit."
        )
    return float(rate)


def parse_event_types(value: str) -> list[str]:
    """The event types a consumer receives: comma-separated patterns (broker/event_types.py);
    blank, every message."""
    try:
        return event_types.parse_patterns(value)
    except event_types.InvalidEventType as error:
        raise InvalidSetting(f"eventTypes: {error}") from None


def checked_signing_secret(value: str) -> str:
    """An imported "whsec_…" secret; the message never repeats the value. Blank (the UI's and
    the admin's forms; the API refuses a blank one first) keeps the current secret: ""."""
    if not value:
        return ""
    try:
        decode_secret(value)
    except InvalidSecret as error:
        raise InvalidSetting(f"signingSecret: {error}") from None
    return value


def _int_list(value: str, *, low: int, high: int, what: str) -> list[int]:
    try:
        numbers = [parse_int(item) for item in value.split(",") if item.strip()]
    except ValueError:
        raise InvalidSetting(f"{what}: comma-separated integers.") from None
    if any(not low <= number <= high for number in numbers):
        raise InvalidSetting(f"{what}: each between {low} and {high}.")
    return numbers


# The settings, each declared once


def _joined(values: list[Any] | None) -> str:
    return ", ".join(str(value) for value in values or [])


def _number(value: float | None) -> str:
    """A number as typed (20, not 20.0); blank for None."""
    return "" if value is None else str(value).removesuffix(".0")


@dataclass(frozen=True)
class ConsumerSetting:
    """One consumer setting as every form takes it: `wire`, its API field name (and the name its
    error messages give); `attribute`, the Consumer field it sets; `parse`, its form text to the
    value, raising InvalidSetting; `as_text`, the value back to form text (edit forms)."""

    wire: str
    attribute: str
    parse: Callable[[str], Any]
    as_text: Callable[[Any], str] = _number
    max_length: int | None = None

    def clean(self, text: str) -> Any:
        """The parsed value; a refusal as Django's ValidationError, which a Django form field and
        a DRF serializer field both show as an error of the field."""
        return validated(self.parse, text)

    def text_of(self, consumer: Consumer) -> str:
        return self.as_text(getattr(consumer, self.attribute))


CALLBACK_URL = ConsumerSetting(
    "callbackUrl", "callback_url", checked_callback_url, str, MAX_CALLBACK_URL_LENGTH
)
RETRY_DELAYS = ConsumerSetting("retryDelays", "retry_delays", parse_retry_delays, _joined)
NON_RETRYABLE_STATUSES = ConsumerSetting(
    "nonRetryableStatuses", "non_retryable_statuses", parse_non_retryable_statuses, _joined
)
MAX_IN_FLIGHT = ConsumerSetting("maxInFlight", "max_in_flight", parse_max_in_flight)
MAX_JOB_AGE = ConsumerSetting("maxJobAge", "max_job_age", parse_max_job_age)
MAX_PER_SECOND = ConsumerSetting("maxPerSecond", "max_per_second", parse_max_per_second)
EVENT_TYPES = ConsumerSetting("eventTypes", "event_types", parse_event_types, _joined)
# Never shown again (as_text): a form's field for it starts blank, which keeps the secret.
SIGNING_SECRET = ConsumerSetting(
    "signingSecret", "signing_secret", checked_signing_secret, lambda _: "", MAX_SECRET_LENGTH
)
# The settings saved as they are parsed (the signing secret is replaced by its own method), in
# the order of the forms.
SETTINGS = (
    CALLBACK_URL,
    RETRY_DELAYS,
    NON_RETRYABLE_STATUSES,
    MAX_IN_FLIGHT,
    MAX_PER_SECOND,
    MAX_JOB_AGE,
    EVENT_TYPES,
)
# The settings form's fields (the API's wire names) and the model attributes they set.
FORM_TO_MODEL = {"ordering": "ordering"} | {s.wire: s.attribute for s in SETTINGS}


class SettingFormField(forms.CharField):
    """A consumer setting typed into a Django form (the UI's, the admin's): the CharField's own
    checks, then its declaration's."""

    def __init__(self, setting: ConsumerSetting, **kwargs: Any) -> None:
        self.setting = setting
        kwargs.setdefault("max_length", setting.max_length)
        super().__init__(**kwargs)

    def clean(self, value: Any) -> Any:
        return self.setting.clean(super().clean(value))


# Writes


def save_consumer(
    channel: Channel,
    consumer_id: str,
    form: dict[str, Any],
    check: Callable[[Consumer | None], None],
) -> Consumer:
    """Create or update a consumer from validated settings (the API's wire names as keys).

    The row is locked while `check` looks at it (None: no such consumer yet) and may raise to
    refuse the write: the API checks If-Unmodified-Since, the UI its form's ChangedAt, so a change
    made by someone else in between is never overwritten. An omitted field keeps its value.
    """
    with transaction.atomic():
        consumer = (
            Consumer.objects.select_for_update()
            .filter(channel=channel, public_id=consumer_id)
            .first()
        )
        check(consumer)
        was_pull = consumer is not None and consumer.is_pull
        if consumer is None:
            consumer = Consumer(channel=channel, public_id=consumer_id)
        apply_settings(consumer, form)
        consumer.save()
        if was_pull and not consumer.is_pull:
            restart_age(consumer)  # its jobs' age limit counts from when it can receive them
    return consumer


def apply_settings(consumer: Consumer, form: dict[str, Any]) -> None:
    """Set the form's fields on the consumer (not saved); a new consumer gets its defaults."""
    apply_stakeholder_form(consumer, form, default_name=consumer.public_id)
    if form.get("type") or consumer._state.adding:
        consumer.type = form.get("type") or Consumer.Type.PUSH
    if "maxPerSecond" in form and form["maxPerSecond"] != consumer.max_per_second:
        forget_booked_slots(consumer)
    for field, attribute in FORM_TO_MODEL.items():
        if field in form:
            setattr(consumer, attribute, form[field])
    if "signingSecret" in form:
        consumer.replace_signing_secret(form["signingSecret"])


def forget_booked_slots(consumer: Consumer) -> None:
    """For a consumer whose delivery rate (max_per_second) changes, before it is saved: the
    slots booked at the old rate do not hold the new one back (the next claim books from now)."""
    consumer.next_slot_at = None


def set_paused(consumer: Consumer, paused: bool) -> None:
    """Pause or resume delivery (docs/delivery.md, "Pause"); callers lock the consumer's row first,
    so that ChangedAt moves past the latest change.

    Saving moves ChangedAt, so dispatchers reload the consumer; a request that changes nothing
    (pausing a paused consumer) saves nothing and keeps Last-Modified valid for clients.
    """
    if consumer.paused == paused:
        return
    consumer.paused = paused
    # Only these columns: the others have writers of their own (a dispatcher's recording changes
    # the circuit, last failure and hold of any consumer row it can lock, FOR NO KEY UPDATE SKIP
    # LOCKED; a claim books rate limit slots), and a save of every column would write back
    # whatever this instance read before them.
    consumer.save(update_fields=["paused", "changed_at"])
    if not paused:
        restart_age(consumer)  # the time it was held back is not held against its jobs


def find_consumer(channel_id: str, consumer_id: str, *, lock: bool = False) -> Consumer:
    """The consumer (its row locked until the transaction ends if `lock`); ConsumerNotFound
    when there is none."""
    consumers = Consumer.objects.select_for_update() if lock else Consumer.objects.all()
    try:
        return consumers.get(channel_id=channel_id, public_id=consumer_id)
    except Consumer.DoesNotExist:
        raise ConsumerNotFound(channel_id, consumer_id) from None


def pause_consumer(channel_id: str, consumer_id: str, paused: bool) -> Consumer:
    """Pause (or resume) the consumer under its row lock and return it as it now is."""
    with transaction.atomic():
        consumer = find_consumer(channel_id, consumer_id, lock=True)
        set_paused(consumer, paused)
    return consumer


def close_circuit(channel_id: str, consumer_id: str) -> Consumer:
    """Close the consumer's circuit now (docs/delivery.md, "Circuit breaker") and return it."""
    consumer = find_consumer(channel_id, consumer_id)
    circuit.close(consumer)
    return consumer


def rotate_signing_secret(channel_id: str, consumer_id: str) -> Consumer:
    """Rotate the consumer's signing secret (the old one signs for 24 more hours) and return it."""
    with transaction.atomic():
        # Locked so that two concurrent rotations cannot both demote the same secret.
        consumer = find_consumer(channel_id, consumer_id, lock=True)
        consumer.rotate_signing_secret(timezone.now())
    return consumer
