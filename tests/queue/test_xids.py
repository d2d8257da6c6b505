"""Job IDs and generated message IDs are xids, as webhook-broker's Go clients decode them."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
import time_machine
from hypothesis import given
from hypothesis import strategies as st

from broker import publish
from broker.xids import decode_xid, encode_xid, key_of_xid, new_xid, public_key_xid
from jobs.models import Job
from jobs.queue import take_for_pull
from jobs.states import DEAD
from tests.helpers import make_channel, make_consumer, make_producer

XID = re.compile(r"[0-9a-v]{20}\Z")
NOW = datetime(2026, 3, 1, 12, 0, 5, 900_000, tzinfo=UTC)

# rs/xid's own test vector: these 12 bytes are spelled so, and that spelling decodes to them.
VECTOR_BYTES = bytes.fromhex("4d88e15b60f486e428412dc9")
VECTOR_TEXT = "9m4e2mr0ui3e8a215n4g"


def test_the_encoding_is_rs_xids():
    assert encode_xid(VECTOR_BYTES) == VECTOR_TEXT
    assert decode_xid(VECTOR_TEXT) == VECTOR_BYTES


@pytest.mark.parametrize(
    "text",
    [
        VECTOR_TEXT.upper(),  # capitals: base32 decoders take them, rs/xid does not
        VECTOR_TEXT[:-1] + "h",  # spare bits of the last character set
        VECTOR_TEXT[:-1],
        VECTOR_TEXT + "0",
        VECTOR_TEXT[:-1] + "w",  # outside 0-9a-v
        VECTOR_TEXT[:-1] + "=",
        "",
        "٣" * 20,
    ],
)
def test_what_rs_xid_refuses_is_no_xid(text):
    assert decode_xid(text) is None
    assert key_of_xid(text) is None


@given(st.integers(0, 2**32 - 1), st.integers(1, 2**63 - 1))
def test_a_key_and_second_come_back_from_their_xid(seconds, key):
    text = public_key_xid(seconds, key)

    assert XID.match(text)
    assert key_of_xid(text) == (seconds, key)


@given(st.text(alphabet="0123456789abcdefghijklmnopqrstuvwxyzABC=", min_size=18, max_size=22))
def test_any_text_decodes_to_nothing_or_to_bytes_spelled_exactly_so(text):
    raw = decode_xid(text)

    assert raw is None or encode_xid(raw) == text


def test_a_key_beyond_bigint_names_no_row():
    assert key_of_xid(encode_xid(bytes(4) + (2**63).to_bytes(8, "big"))) is None


def test_fresh_xids_carry_the_time_and_never_repeat():
    with time_machine.travel(NOW, tick=False):
        made = [new_xid() for _ in range(10_000)]

    assert len(set(made)) == len(made)
    assert all(XID.match(text) for text in made)
    seconds = {bytes(decode_xid(text) or b"")[:4] for text in made}
    assert seconds == {int(NOW.timestamp()).to_bytes(4, "big")}


@pytest.mark.django_db
def test_a_jobs_id_is_its_creation_second_and_key_and_stays_for_its_life():
    channel = make_channel()
    make_producer()
    make_consumer(channel)
    with time_machine.travel(NOW, tick=False):
        publish(channel, b"{}", producer="shop")
    job = Job.objects.get()
    first = job.public_id

    take_for_pull(job)
    job.mark_dead("gave up")
    job.requeue()
    job.refresh_from_db()

    assert XID.match(first)
    assert key_of_xid(first) == (int(NOW.timestamp()), job.pk)
    assert job.public_id == first
    assert list(Job.objects.with_public_id(first)) == [job]
    assert Job.objects.filter(status=DEAD).count() == 0


@pytest.mark.django_db
def test_a_message_published_without_an_id_gets_an_xid():
    channel = make_channel()
    make_producer()

    with time_machine.travel(NOW, tick=False):
        message = publish(channel, b"{}", producer="shop")

    assert XID.match(message.public_id)
    raw = decode_xid(message.public_id)
    assert raw is not None
    assert int.from_bytes(raw[:4], "big") == int(NOW.timestamp())
