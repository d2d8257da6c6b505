"""Consumers of a channel: where and how its messages are delivered (docs/data-model.md;
docs/api.md)."""

from __future__ import annotations

import base64
import secrets
from datetime import datetime, timedelta

from django.db import models

from broker.conf import broker_settings
from broker.crypto import EncryptedTextField
from broker.models import ChangeTracked, Channel, validate_resource_id
from broker.tokens import generate_token, secrets_equal
from consumers.callback_url import masked_callback_url, validate_callback_url

SIGNING_FIELDS = ["signing_secret", "previous_signing_secret", "previous_secret_expires_at"]


def generate_signing_secret() -> str:
    """A Standard Webhooks secret: "whsec_" and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


class Consumer(ChangeTracked):
    class Type(models.TextChoices):
        PUSH = "push"
        PULL = "pull"

    class Ordering(models.TextChoices):
        NONE = "none"
        ORDERED = "ordered"

    # The unique (channel, public_id) constraint below doubles as the channel index.
    channel = models.ForeignKey(
        Channel, on_delete=models.CASCADE, related_name="consumers", db_index=False
    )
    public_id = models.CharField(max_length=255, validators=[validate_resource_id])
    name = models.CharField(max_length=255)
    # Encrypted, not hashed: push deliveries send it to the consumer in X-Broker-Consumer-Token.
    token = EncryptedTextField(default=generate_token)
    callback_url = models.CharField(max_length=2048, validators=[validate_callback_url])
    type = models.CharField(max_length=4, choices=Type.choices, default=Type.PUSH)
    paused = models.BooleanField(default=False)
    ordering = models.CharField(max_length=7, choices=Ordering.choices, default=Ordering.NONE)
    # Seconds to wait before each retry; null means the global BROKER_RETRY_DELAYS.
    retry_delays = models.JSONField(null=True, blank=True)
    non_retryable_statuses = models.JSONField(default=list, blank=True)
    # The event types it receives (broker/event_types.py): patterns; empty, every message. Applied
    # when a message's jobs are made, so a change affects later messages only.
    event_types = models.JSONField(default=list, blank=True)
    max_in_flight = models.PositiveIntegerField(null=True, blank=True)
    # Delivery rate limit (docs/delivery.md, "Rate limit"): push requests per second at most,
    # across all dispatchers; null, no limit.
    max_per_second = models.FloatField(null=True, blank=True)
    # Seconds a push job may stay undelivered before it expires (jobs/queue/expiry.py); null means
    # BROKER_MAX_JOB_AGE_SECONDS, 0 no limit.
    max_job_age = models.PositiveIntegerField(null=True, blank=True)
    # Standard Webhooks signing secret ("whsec_" + base64). After a rotation the previous one
    # keeps signing alongside it until previous_secret_expires_at (docs/delivery.md, "Signing").
    signing_secret = EncryptedTextField(default=generate_signing_secret)
    previous_signing_secret = EncryptedTextField(null=True, blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    # Circuit breaker (jobs/queue/circuit.py, its one owner): failed attempts in a row; while
    # `circuit_open_until` is in the future nothing is claimed for this consumer; once it has
    # passed, one probe is. Changed by the dispatcher without touching changed_at (delivery activity
    # is not a change of settings).
    circuit_failures = models.PositiveIntegerField(default=0)
    circuit_open_until = models.DateTimeField(null=True, blank=True)
    circuit_cooldown_seconds = models.PositiveIntegerField(default=0)  # the last one used
    # Pacing (docs/delivery.md, "Rate limit"), also the dispatcher's alone, without changed_at:
    # the time of the consumer's next free delivery slot under max_per_second, which each push
    # claim moves on by the jobs it takes; and until when a 429 with Retry-After holds back
    # every job of the consumer.
    next_slot_at = models.DateTimeField(null=True, blank=True)
    throttled_until = models.DateTimeField(null=True, blank=True)
    # Its newest failed push attempt, so that its page and the dashboard say why it fails without
    # reading its attempts: when, and what went wrong ("HTTP 503" or why there was no answer,
    # with the head of the answer). Kept by the dispatcher's recording of failures, without
    # changed_at, and left in place by later successes (its newest attempt tells those).
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_failure = models.TextField(blank=True, default="")
    # The token as just set through set_token, so the response that set it can show it.
    plain_token: str | None = None

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "public_id"], name="consumer_id_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.channel_id}/{self.public_id}"

    @property
    def masked_callback_url(self) -> str:
        """The callback URL as a page or a log may show it: its credentials and query masked."""
        return masked_callback_url(self.callback_url)

    @property
    def retry_delays_in_effect(self) -> list[int]:
        if self.retry_delays is not None:
            return list(self.retry_delays)
        return list(broker_settings.BROKER_RETRY_DELAYS)

    @property
    def max_attempts(self) -> int:
        """One first attempt plus one per retry delay."""
        return len(self.retry_delays_in_effect) + 1

    @property
    def max_per_second_text(self) -> str:
        """The rate limit as typed (20, not 20.0); "" when there is none."""
        rate = self.max_per_second
        return "" if rate is None else str(rate).removesuffix(".0")

    @property
    def is_pull(self) -> bool:
        return self.type == Consumer.Type.PULL

    def set_token(self, token: str | None = None) -> str:
        """Store a token (a new random one when None) and return it in plain text."""
        token = token or generate_token()
        self.token = self.plain_token = token
        return token

    def check_token(self, given: str | None) -> bool:
        return secrets_equal(given, self.token)

    def active_signing_secrets(self, now: datetime) -> list[str]:
        """The secrets that sign deliveries at `now`: the current one, then the previous one while
        its overlap lasts."""
        active = [self.signing_secret]
        expires_at = self.previous_secret_expires_at
        if self.previous_signing_secret and expires_at is not None and now < expires_at:
            active.append(self.previous_signing_secret)
        return active

    def rotate_signing_secret(self, now: datetime, overlap: timedelta = timedelta(hours=24)) -> str:
        """Switch to a new random secret, save, and return it.

        The old one keeps signing until now + overlap, so receivers can move to the new one
        without rejecting deliveries in between. Only one previous secret is kept: rotating again
        within the overlap drops the oldest.
        """
        new_secret = generate_signing_secret()
        self.previous_signing_secret = self.signing_secret
        self.previous_secret_expires_at = now + overlap
        self.signing_secret = new_secret
        self.save(update_fields=[*SIGNING_FIELDS, "changed_at"])
        return new_secret

    def replace_signing_secret(self, secret: str) -> None:
        """Sign with `secret` (an imported one) from now on, without an overlap; not saved.

        Whoever imports a secret has already given it to the receiver, so older secrets need not
        sign any more. The caller saves it with the rest of its change (the consumer PUT).
        """
        self.signing_secret = secret
        self.previous_signing_secret = None
        self.previous_secret_expires_at = None
