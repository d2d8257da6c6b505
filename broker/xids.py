"""xids: the 20-character IDs webhook-broker gives jobs and generated messages.

An xid (the format of github.com/rs/xid, which upstream's Go clients decode with
`xid.FromString`) is 12 bytes written in lowercase base32hex without padding: 4 bytes of Unix
seconds, then 8 bytes that make it unique. Clients only check the text's shape and that it is the
canonical spelling of its bytes, so the 8 bytes are ours to choose:

- a job's ID is its creation second and its row key (`public_key_xid`): nothing to store, stable
  for the job's life, and read back into the key for a primary-key lookup (`key_of_xid`);
- a generated message ID is a fresh xid as rs/xid makes them (`new_xid`): machine, process and
  a counter, so two brokers never hand out the same one.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import os
import re
import secrets
import socket
import time

_RAW_LENGTH = 12
_PADDING = "===="  # 12 bytes are 20 base32 characters, padded to 24
_SHAPE = re.compile(r"[0-9a-v]{20}\Z")
_SECONDS_MASK = 0xFFFFFFFF  # 32-bit seconds wrap in 2106, as in rs/xid
LARGEST_KEY = 2**63 - 1  # the largest row key: PostgreSQL's bigint

_MACHINE = hashlib.sha256(socket.gethostname().encode()).digest()[:3]
_COUNTER = itertools.count(secrets.randbelow(1 << 24))  # next() is atomic under the GIL


def encode_xid(raw: bytes) -> str:
    if len(raw) != _RAW_LENGTH:
        raise ValueError(f"an xid holds {_RAW_LENGTH} bytes, not {len(raw)}")
    return base64.b32hexencode(raw).decode("ascii").rstrip("=").lower()


def decode_xid(text: str) -> bytes | None:
    """The 12 bytes of an xid, or None if `text` is not one as rs/xid reads them: 20 characters of
    0-9a-v spelling exactly those bytes (the last character's spare bits zero)."""
    if not _SHAPE.match(text):
        return None
    raw = base64.b32hexdecode(text.upper() + _PADDING)
    return raw if encode_xid(raw) == text else None


def new_xid(now: float | None = None) -> str:
    """A fresh xid: seconds, 3 bytes of this machine, 2 of this process, a 3-byte counter."""
    seconds = int(time.time() if now is None else now) & _SECONDS_MASK
    counter = next(_COUNTER) & 0xFFFFFF
    raw = (
        seconds.to_bytes(4, "big")
        + _MACHINE
        + (os.getpid() & 0xFFFF).to_bytes(2, "big")
        + counter.to_bytes(3, "big")
    )
    return encode_xid(raw)


def public_key_xid(seconds: float, key: int) -> str:
    """The xid naming the row `key` created at `seconds` (Unix time)."""
    return encode_xid((int(seconds) & _SECONDS_MASK).to_bytes(4, "big") + key.to_bytes(8, "big"))


def key_of_xid(text: str) -> tuple[int, int] | None:
    """(creation seconds, row key) of an xid made by `public_key_xid`, or None if malformed."""
    raw = decode_xid(text)
    if raw is None:
        return None
    key = int.from_bytes(raw[4:], "big")
    if key > LARGEST_KEY:
        return None
    return int.from_bytes(raw[:4], "big"), key
