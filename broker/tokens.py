"""Access tokens: generation, hashing for storage, constant-time verification.

Channel and producer tokens are stored only as SHA-256 digests: a database dump does not reveal
them, and they are shown once, in the response that set them. A fast hash is enough because
generated tokens carry 256 bits of entropy; a slow KDF would cost a broadcast its throughput.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets


def generate_token() -> str:
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(given: str | None, stored_hash: str) -> bool:
    """Compare in constant time, so response timing reveals nothing about the stored token."""
    return bool(given) and digests_equal(hash_token(given or ""), stored_hash)


def digests_equal(given_digest: str | None, stored_hash: str) -> bool:
    """Whether a given token's digest (`hash_token`) is the stored one, in constant time."""
    if not given_digest or not stored_hash:
        return False
    return hmac.compare_digest(given_digest, stored_hash)


def secrets_equal(given: str | None, expected: str) -> bool:
    """Constant-time equality for a secret kept in plain text (after decryption)."""
    return bool(expected) and token_matches(given, hash_token(expected))
