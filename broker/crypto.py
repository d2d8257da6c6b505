"""Encryption at rest for secrets the broker must read back (consumer tokens, signing secrets).

Values are Fernet tokens (AES-128-CBC + HMAC-SHA256). `BROKER_ENCRYPTION_KEYS` lists keys newest
first: the first encrypts, all decrypt, so keys rotate without a migration. Without it, one key is
derived from SECRET_KEY.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models

from broker.conf import broker_settings


def _derived_key(secret_key: str) -> bytes:
    digest = hashlib.sha256(b"webhook-broker encryption at rest:" + secret_key.encode()).digest()
    return base64.urlsafe_b64encode(digest)


@functools.cache
def _cipher(keys: tuple[str, ...], secret_key: str) -> MultiFernet:
    raw_keys = [key.encode() for key in keys] or [_derived_key(secret_key)]
    try:
        return MultiFernet([Fernet(key) for key in raw_keys])
    except ValueError:
        raise ImproperlyConfigured(
            "BROKER_ENCRYPTION_KEYS must hold Fernet keys (32 url-safe base64-encoded bytes)."
        ) from None


def cipher() -> MultiFernet:
    return _cipher(tuple(broker_settings.BROKER_ENCRYPTION_KEYS), settings.SECRET_KEY)


def encrypt(plaintext: str) -> str:
    return cipher().encrypt(plaintext.encode()).decode()


def decrypt(ciphertext: str) -> str:
    try:
        return cipher().decrypt(ciphertext.encode()).decode()
    except InvalidToken:
        raise ImproperlyConfigured(
            "A stored secret cannot be decrypted: SECRET_KEY or BROKER_ENCRYPTION_KEYS changed "
            "without keeping the old key in BROKER_ENCRYPTION_KEYS."
        ) from None


class EncryptedTextField(models.TextField):  # type: ignore[type-arg]
    """A text column holding ciphertext; Python code only ever sees the plaintext."""

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> str | None:
        return None if value is None else decrypt(value)

    def get_prep_value(self, value: Any) -> str | None:
        value = super().get_prep_value(value)
        return None if value is None else encrypt(value)
