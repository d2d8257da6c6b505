"""Core domain: producers, channels and messages (docs/data-model.md)."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models, transaction
from django.db.models import Q
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from broker import payloads
from broker.message_states import MessageStatus, check_message_transition
from broker.tokens import generate_token, hash_token, token_matches

# Client-chosen IDs appear in URL paths, so they are restricted to URL-safe characters.
validate_resource_id = RegexValidator(
    r"^[A-Za-z0-9_-]{1,255}\Z", "Use 1 to 255 letters, digits, '_' or '-'."
)


def is_resource_id(value: str) -> bool:
    try:
        validate_resource_id(value)
    except ValidationError:
        return False
    return True


# Message IDs also allow '.' and ':' (UUIDs, "order:42", "v1.2") but must not start with a dot, so
# they can never be the path segments "." or "..".
MESSAGE_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,254}\Z"
validate_message_id = RegexValidator(
    MESSAGE_ID_PATTERN,
    "Use 1 to 255 letters, digits, '_', '-', '.' or ':' (not starting with '.', ':' or '-').",
)


def next_change_time(previous: datetime | None) -> datetime:
    """Now, but always in a later second than `previous`.

    `changed_at` is served as Last-Modified, an HTTP date with one-second precision. Moving every
    change past the previous second means a client holding an older Last-Modified can never pass
    the If-Unmodified-Since check, even when two changes fall within one second.
    """
    now = timezone.now()
    if previous is None:
        return now
    earliest = previous.replace(microsecond=0) + timedelta(seconds=1)
    return max(now, earliest)


class ChangeTracked(models.Model):
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    changed_at = models.DateTimeField(editable=False)  # the API's ChangedAt and Last-Modified

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.changed_at = next_change_time(None if self._state.adding else self.changed_at)
        super().save(*args, **kwargs)


class TokenProtected(ChangeTracked):
    """A resource named by a client-chosen ID and guarded by a token stored as a hash."""

    id = models.CharField(primary_key=True, max_length=255, validators=[validate_resource_id])
    name = models.CharField(max_length=255)
    token_hash = models.CharField(max_length=64, editable=False)
    # The token in plain text, only on the instance that just set it (never stored).
    plain_token: str | None = None

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return self.id

    @property
    def public_id(self) -> str:
        return self.id

    def set_token(self, token: str | None = None) -> str:
        """Store a token (a new random one when None) and return it in plain text, once."""
        token = token or generate_token()
        self.token_hash = hash_token(token)
        self.plain_token = token
        return token

    def check_token(self, given: str | None) -> bool:
        return token_matches(given, self.token_hash)


class Producer(TokenProtected):
    # The channels it may publish to when BROKER_PRODUCER_CHANNELS=bound (docs/api.md, "Producers
    # bound to channels"); kept but not enforced when `open`, webhook-broker's rule. The publish
    # statements probe the join table's unique (producer, channel) index.
    allowed_channels: models.ManyToManyField[Channel, Any] = models.ManyToManyField(
        "Channel",
        blank=True,
        related_name="allowed_producers",
        verbose_name="channels it may publish to",
        help_text="Enforced only with BROKER_PRODUCER_CHANNELS=bound.",
    )


class Channel(TokenProtected):
    pass


class MessageQuerySet(models.QuerySet["Message"]):
    def transition(self, source: MessageStatus, target: MessageStatus, **changes: Any) -> int:
        """Move the messages of this queryset that are still `source` to `target` (one
        conditional UPDATE, as for jobs); returns how many this caller moved."""
        check_message_transition(source, target)
        return self.filter(status=source).update(status=target, **changes)


class Message(models.Model):
    Status = MessageStatus  # broker/message_states.py: the statuses and the allowed changes

    # No single-column FK indexes: the unique (channel, public_id) constraint already leads with
    # channel, and a producer is only looked up by its messages when it is deleted (rare; a scan is
    # acceptable there, an extra index on every publish is not).
    channel = models.ForeignKey(
        Channel, on_delete=models.CASCADE, related_name="messages", db_index=False
    )
    producer = models.ForeignKey(
        Producer, on_delete=models.PROTECT, related_name="messages", db_index=False
    )
    public_id = models.CharField(max_length=255, validators=[validate_message_id])
    payload = models.BinaryField()  # empty when the payload is offloaded
    # The name of the payload's file in the payload storage, for payloads above
    # BROKER_PAYLOAD_OFFLOAD_BYTES (docs/delivery.md, "Large payloads"); "" when the payload is in
    # the row.
    payload_file = models.CharField(max_length=255, blank=True, default="")
    payload_size = models.PositiveIntegerField(default=0)  # bytes, wherever they are kept
    content_type = models.CharField(max_length=255)
    priority = models.IntegerField(default=0)
    # Metadata headers kept from the broadcast request and replayed on delivery.
    headers = models.JSONField(default=dict, blank=True)
    # Ordered consumers get the messages of one key one at a time, in publish order
    # (docs/delivery.md, "Ordering"); "" is the key of every message published without one.
    ordering_key = models.CharField(max_length=255, blank=True, default="")
    # What kind of event it is (broker/event_types.py), which consumers subscribe to; null: none.
    event_type = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    status = models.CharField(max_length=12, choices=Status.choices)
    received_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # Set for a scheduled message (and kept after its release): when it is due.
    scheduled_for = models.DateTimeField(null=True, blank=True)
    # The W3C trace context its deliveries continue (broker/tracing.py): the broker's publish
    # span when tracing is on, else the producer's own; null when there was none.
    # Null, never "", for none: the columns were added to a table of any size without a rewrite.
    traceparent = models.CharField(max_length=55, null=True, blank=True)  # noqa: DJ001
    tracestate = models.CharField(max_length=512, null=True, blank=True)  # noqa: DJ001

    objects = MessageQuerySet.as_manager()

    class Meta:
        constraints = [
            # Also serves GET /channel/{c}/message/{m} and the duplicate check on publish.
            models.UniqueConstraint(fields=["channel", "public_id"], name="message_id_unique"),
        ]
        indexes = [
            # GET /channel/{c}/messages?status=…, newest (highest id) first, keyset-paginated.
            models.Index(fields=["channel", "status", "-id"], name="message_channel_status_idx"),
            # The release of scheduled messages: those due, oldest first (also the operator UI's
            # list of pending scheduled messages of every channel).
            models.Index(
                fields=["scheduled_for"],
                condition=Q(status="SCHEDULED"),
                name="message_scheduled_due_idx",
            ),
            # The operator UI's scheduled messages of one channel waiting for release, soonest
            # first.
            models.Index(
                fields=["channel", "scheduled_for", "id"],
                condition=Q(status="SCHEDULED"),
                name="message_channel_pending_idx",
            ),
            # GET /channel/{c}/scheduled-messages, newest first.
            models.Index(
                fields=["channel", "-id"],
                condition=Q(scheduled_for__isnull=False),
                name="message_channel_scheduled_idx",
            ),
            # purge_orphan_payloads: which of these stored files does a message name? Partial, so
            # messages with inline payloads (nearly all) are not in it.
            models.Index(
                fields=["payload_file"],
                condition=~Q(payload_file=""),
                name="message_payload_file_idx",
            ),
        ]

    # An offloaded payload once read, so that one request reads its file once.
    _offloaded_payload: bytes | None = None

    def __str__(self) -> str:
        return f"{self.channel_id}/{self.public_id}"

    def read_payload(self) -> bytes:
        """The payload, from the row or from storage; PayloadMissing if its file is gone."""
        if not self.payload_file:
            return bytes(self.payload)
        if self._offloaded_payload is None:
            self._offloaded_payload = payloads.read(self.payload_file)
        return self._offloaded_payload

    @classmethod
    def purge_orphan_payloads(cls, older_than: timedelta, batch: int = 1000) -> int:
        """Delete stored payload files that no message names and that were written before
        `older_than` ago; return how many.

        Orphans come from a publish inside a transaction that then rolled back, a process that
        died between writing the file and inserting the row, or a deletion outside the ORM. The
        age keeps this away from files whose message is being inserted in a transaction still
        open: keep it above your longest transaction.
        """
        names = iter(payloads.stored_before(timezone.now() - older_than))
        deleted = 0
        while chunk := set(itertools.islice(names, batch)):
            named = cls.objects.filter(payload_file__in=chunk).values_list(
                "payload_file", flat=True
            )
            for name in chunk - set(named):
                payloads.delete(name)
                deleted += 1
        return deleted


class ApiKey(models.Model):
    """An admin API key (`Authorization: Bearer <key>`), stored hashed; delete it to revoke."""

    name = models.CharField(max_length=255, unique=True)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Rights over the broker's credentials that belong to no one model (Django ties every
        # permission to a model); who needs which is in docs/ui.md and docs/api.md.
        permissions = [
            ("administer_broker", "Can use the REST admin API with a login session"),
            ("manage_signing_secrets", "Can reveal and rotate the signing secrets of consumers"),
        ]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def issue(cls, name: str) -> tuple[ApiKey, str]:
        """Create a key and return it with its plain text, which is never stored."""
        key = generate_token()
        with transaction.atomic():  # a duplicate name must not break the caller's transaction
            return cls.objects.create(name=name, key_hash=hash_token(key)), key


# A signal rather than a method, because messages are mostly deleted by cascades and bulk deletes
# (a channel deleted, the admin's bulk action) that never call a model method. The file goes only
# once the deletion commits: a rolled-back deletion keeps its message, which still needs it.
@receiver(post_delete, sender=Message)
def delete_offloaded_payload(sender: type[Message], instance: Message, **kwargs: Any) -> None:
    if instance.payload_file:
        payloads.delete_on_commit(instance.payload_file)


class EventType(ChangeTracked):
    """An entry of a channel's event type catalogue (broker/event_catalogue.py): what a type
    means and, optionally, the JSON Schema its JSON payloads must match."""

    channel = models.ForeignKey(
        Channel, on_delete=models.CASCADE, related_name="event_types", db_index=False
    )
    name = models.CharField(max_length=255)  # an event type (broker/event_types.py)
    description = models.TextField(blank=True, default="")
    schema = models.JSONField(null=True, blank=True)  # a JSON Schema; null: none

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "name"], name="event_type_name_unique"),
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.channel_id}/{self.name}"


class PeriodicMessage(ChangeTracked):
    """A message published on a schedule (docs/periodic.md): every `interval_seconds`, or at the
    times of the cron expression `cron` in the time zone `timezone`. Each tick publishes one
    message."""

    channel = models.ForeignKey(
        Channel, on_delete=models.CASCADE, related_name="periodic_messages", db_index=False
    )
    producer = models.ForeignKey(
        Producer, on_delete=models.PROTECT, related_name="periodic_messages", db_index=False
    )
    public_id = models.CharField(max_length=255, validators=[validate_resource_id])
    payload = models.BinaryField()
    content_type = models.CharField(max_length=255)
    priority = models.IntegerField(default=0)
    headers = models.JSONField(default=dict, blank=True)
    ordering_key = models.CharField(max_length=255, blank=True, default="")
    event_type = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 (as Message's)
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    cron = models.CharField(max_length=255, blank=True, default="")
    timezone = models.CharField(max_length=64, default="UTC")  # an IANA name, for `cron`
    enabled = models.BooleanField(default=True)
    # Skip a tick while the messages of the previous one still have undelivered jobs.
    skip_while_pending = models.BooleanField(default=False)
    next_run_at = models.DateTimeField(null=True, blank=True)  # the next tick; null: disabled
    last_run_at = models.DateTimeField(null=True, blank=True)  # the last tick that published
    last_message = models.ForeignKey(
        Message, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    skipped_ticks = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "public_id"], name="periodic_message_id_unique"
            ),
            # Exactly one kind of schedule.
            models.CheckConstraint(
                condition=Q(interval_seconds__isnull=False, cron="")
                | (Q(interval_seconds__isnull=True) & ~Q(cron="")),
                name="periodic_message_one_schedule",
            ),
        ]
        indexes = [
            # The tick: enabled schedules that are due.
            models.Index(
                fields=["next_run_at"], condition=Q(enabled=True), name="periodic_due_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel_id}/{self.public_id}"
