"""Offloaded payloads (docs/delivery.md, "Large payloads"): the one place that talks to the payload
storage.

Payloads above BROKER_PAYLOAD_OFFLOAD_BYTES are kept as files in `STORAGES[BROKER_PAYLOAD_STORAGE]`
(any Django storage: the filesystem by default, S3-compatible through django-storages) and the
message row holds only the file's name. Names are random UUIDs: unique without a look-up, and
unguessable, so a storage listing or a URL leaks nothing about which message a file belongs to.

A file is written before its message row is inserted, so a committed message never names a file
that was not written. A publish that is refused after writing files (the storage filled up at the
third payload of a batch, a duplicate ID, a value the database refused) deletes every file it
wrote (`DeletedIfRefused`), so a refusal changes nothing. What remains can only be a file whose
row may or may not exist (the connection was lost during the insert: a refusal is not certain),
or whose row never committed (the caller's transaction rolled back, the process died in
between). Those orphans are harmless and are removed by `manage.py purge_orphan_payloads`
(`Message.purge_orphan_payloads`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import datetime
from types import TracebackType

from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.db import transaction

from broker.conf import broker_settings

logger = logging.getLogger(__name__)

# The error class of an attempt, and the start of the reason of a job, whose payload is gone.
PAYLOAD_MISSING = "payload-missing"


class PayloadMissing(LookupError):
    """An offloaded payload is no longer in storage (deleted by hand, lost with a volume, ...)."""

    def __init__(self) -> None:
        super().__init__(f"{PAYLOAD_MISSING}: the offloaded payload is no longer in storage")


class PayloadNotStored(Exception):
    """The payload storage refused a write (disk full, bucket unreachable, ...)."""

    def __init__(self) -> None:
        super().__init__("The payload storage cannot take the payload now; try again later.")


def payload_storage() -> Storage:
    return storages[broker_settings.BROKER_PAYLOAD_STORAGE]


def should_offload(body: bytes) -> bool:
    return is_offloaded_size(len(body))


def is_offloaded_size(size: int) -> bool:
    threshold: int = broker_settings.BROKER_PAYLOAD_OFFLOAD_BYTES
    return size > threshold


def store(body: bytes) -> str:
    """Write a payload to storage under a new random name, and return that name."""
    name = uuid.uuid4().hex
    try:
        return payload_storage().save(name, ContentFile(body))
    except Exception as exc:  # each backend raises its own (OSError, botocore, ...)
        logger.error("could not store an offloaded payload: %s", exc)
        delete(name)  # what a failed write left behind (FileSystemStorage keeps partial files)
        raise PayloadNotStored from exc


class DeletedIfRefused:
    """The payloads one publish stores, deleted again if it is refused.

    `with DeletedIfRefused(refusals) as written:` then `written.store(body)` for each payload:
    when the block raises one of `refusals` (the storage refusing a later payload is one), every
    file stored in it is deleted before the exception goes on. Another exception keeps them: the
    rows naming them may exist.
    """

    def __init__(self, refusals: tuple[type[BaseException], ...]) -> None:
        self.refusals = refusals
        self.names: list[str] = []

    def store(self, body: bytes) -> str:
        name = store(body)
        self.names.append(name)
        return name

    def __enter__(self) -> DeletedIfRefused:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is not None and isinstance(exc, self.refusals):
            for name in self.names:
                delete(name)


def open_payload(name: str) -> File[bytes]:
    """The stored payload opened for reading (blocking I/O: the dispatcher calls it in a thread)."""
    try:
        return payload_storage().open(name, "rb")
    except FileNotFoundError:  # what FileSystemStorage and django-storages' S3 raise
        raise PayloadMissing from None


def read(name: str) -> bytes:
    with open_payload(name) as file:
        content: bytes = file.read()
    return content


def delete(name: str) -> None:
    """Delete a stored payload now; a storage error is logged, the file is left to the purge."""
    try:
        payload_storage().delete(name)
    except Exception:  # any backend's error: the caller's work is done and must not fail for it
        logger.exception("could not delete offloaded payload %s", name)


def delete_on_commit(name: str) -> None:
    """Delete a stored payload once the current transaction commits (now, outside one).

    A rolled-back deletion keeps its message, which still needs the file.
    """
    transaction.on_commit(lambda: delete(name), robust=True)


def stored_before(cutoff: datetime) -> Iterable[str]:
    """Names of the stored payloads last written before `cutoff`."""
    storage = payload_storage()
    try:
        _, names = storage.listdir("")
    except FileNotFoundError:  # a filesystem storage where nothing was ever offloaded
        return
    for name in names:
        if storage.get_modified_time(name) < cutoff:
            yield name
