"""The consumers of a dispatcher's claimed jobs, kept decrypted between claims.

Decrypting a consumer's token and secrets costs more than delivering to it, so a dispatcher
loads a consumer when it first sees it and again only after it changed: every change moves its
`changed_at`, which each claimed job carries (a new URL or a rotated secret applies from the
next claim on).
"""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError

from consumers.models import Consumer
from jobs.queue import ClaimedJob

logger = logging.getLogger(__name__)
POLICY_FIELDS = ("retry_delays", "non_retryable_statuses")  # what jobs/retry.py reads


class UnreadableConsumer(LookupError):
    def __init__(self, consumer_id: int) -> None:
        super().__init__(f"consumer {consumer_id} cannot be read (see the dispatcher's log)")


class ConsumerCache:
    def __init__(self) -> None:
        self._loaded: dict[int, Consumer] = {}

    def as_of_claim(self, claimed: list[ClaimedJob]) -> dict[int, Consumer]:
        """The claimed jobs' consumers, (re)loaded where they changed since last seen."""
        stale = {
            job.consumer_id
            for job in claimed
            if job.consumer_id not in self._loaded
            or self._loaded[job.consumer_id].changed_at != job.consumer_changed_at
        }
        if stale:
            self._loaded.update(_load(stale))
        return self._loaded

    def policies(self, consumer_ids: set[int]) -> dict[int, Consumer]:
        """The consumers whose retry policies apply, as they were at the claim. One not loaded
        here (a caller completes what it did not claim, or the row could not be read) is read
        for its policy alone, no secret decrypted; a deleted one has the global defaults."""
        policies = {pk: self._loaded[pk] for pk in consumer_ids if pk in self._loaded}
        if missing := consumer_ids - policies.keys():
            policies.update(Consumer.objects.only(*POLICY_FIELDS).in_bulk(missing))
        return {pk: policies.get(pk) or Consumer() for pk in consumer_ids}


def _load(ids: set[int]) -> dict[int, Consumer]:
    """The consumers with these IDs, their secrets decrypted, each on its own: one whose row
    cannot be read (a secret that no configured key decrypts) is left out, and only its own jobs
    fail. A lost connection is the caller's to handle."""
    loaded = {}
    for pk in ids:
        try:
            loaded.update(Consumer.objects.in_bulk([pk]))
        except (OperationalError, InterfaceError):
            raise
        except Exception:
            logger.exception("consumer %s cannot be loaded", pk)
    return loaded
