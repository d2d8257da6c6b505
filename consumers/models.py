"""Consumers of a channel: where and how its messages are delivered (SPEC §3, §4)."""

from __future__ import annotations

import base64
import secrets

from django.core.validators import URLValidator
from django.db import models

from broker.conf import broker_settings
from broker.crypto import EncryptedTextField
from broker.models import ChangeTracked, Channel, validate_resource_id
from broker.tokens import generate_token, secrets_equal

validate_callback_url = URLValidator(schemes=["http", "https"])


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
    max_in_flight = models.PositiveIntegerField(null=True, blank=True)
    # Standard Webhooks signing secret ("whsec_" + base64). After a rotation the previous one
    # keeps signing alongside it until previous_secret_expires_at (SPEC §6.5).
    signing_secret = EncryptedTextField(default=generate_signing_secret)
    previous_signing_secret = EncryptedTextField(null=True, blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    # The token as just set through set_token, so the response that set it can show it.
    plain_token: str | None = None

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "public_id"], name="consumer_id_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.channel_id}/{self.public_id}"

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
    def is_pull(self) -> bool:
        return self.type == Consumer.Type.PULL

    def set_token(self, token: str | None = None) -> str:
        """Store a token (a new random one when None) and return it in plain text."""
        token = token or generate_token()
        self.token = self.plain_token = token
        return token

    def check_token(self, given: str | None) -> bool:
        return secrets_equal(given, self.token)
