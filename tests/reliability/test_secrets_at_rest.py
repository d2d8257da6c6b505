"""Tokens are hashed, consumer secrets encrypted, and keys can rotate (docs/api.md;
docs/delivery.md, "Signing")."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from broker.models import Channel
from consumers.models import Consumer
from tests.helpers import make_channel, make_consumer

pytestmark = pytest.mark.django_db


def raw_consumer_token(consumer: Consumer) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT token FROM consumers_consumer WHERE id = %s", [consumer.pk])
        return str(cursor.fetchone()[0])


def test_channel_tokens_are_stored_only_as_hashes():
    make_channel(token="plain-channel-token")

    channel = Channel.objects.get()
    assert "plain-channel-token" not in channel.token_hash
    assert channel.check_token("plain-channel-token")
    assert not channel.check_token("plain-channel-token ")
    assert not channel.check_token("")
    assert not channel.check_token(None)


def test_consumer_tokens_are_encrypted_in_the_database():
    consumer = make_consumer(make_channel())
    consumer.token = "plain-consumer-token"
    consumer.save()

    raw = raw_consumer_token(consumer)

    assert "plain-consumer-token" not in raw
    assert Consumer.objects.get().token == "plain-consumer-token"
    assert Consumer.objects.get().check_token("plain-consumer-token")
    assert not Consumer.objects.get().check_token("wrong")


def test_encryption_keys_rotate_without_losing_stored_secrets(settings):
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.BROKER_ENCRYPTION_KEYS = [old_key]
    consumer = make_consumer(make_channel())
    written_with_old = raw_consumer_token(consumer)

    settings.BROKER_ENCRYPTION_KEYS = [new_key, old_key]
    token = Consumer.objects.get().token
    Consumer.objects.get().save()

    assert Consumer.objects.get().token == token
    assert raw_consumer_token(consumer) != written_with_old
    settings.BROKER_ENCRYPTION_KEYS = [new_key]  # the old key can go once everything is rewritten
    assert Consumer.objects.get().token == token


def test_a_lost_key_is_a_clear_configuration_error(settings):
    make_consumer(make_channel())
    settings.SECRET_KEY = "a-different-secret-key-than-the-one-that-encrypted-the-token"

    with pytest.raises(ImproperlyConfigured, match="cannot be decrypted"):
        Consumer.objects.get()


def test_invalid_encryption_keys_are_reported_by_the_system_check(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.BROKER_ENCRYPTION_KEYS = ["not-a-fernet-key"]

    with pytest.raises(SystemCheckError, match=r"broker\.E001"):
        call_command("check")
