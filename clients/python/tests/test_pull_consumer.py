"""PullConsumer, the client of a pull consumer's claim, report and extend, against a live broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import Broker
from tests.pull_setup import TOKEN, pull_consumer
from webhook_broker_client import PullConsumer, Unauthorized


def test_claim_extend_and_report(broker: Broker) -> None:
    pull = pull_consumer(broker)
    first, second = pull.publish(2)
    with PullConsumer(broker.url, pull.channel, pull.consumer, TOKEN, TOKEN) as consumer:
        claimed = consumer.claim(10, lease_seconds=30)
        assert claimed.retry_after is None
        assert [job["Message"]["MessageID"] for job in claimed.jobs] == [first, second]
        assert [job["Attempts"] for job in claimed.jobs] == [1, 1]
        first_id, second_id = (job["ID"] for job in claimed.jobs)

        # A known job's lease now ends a full lease from now; an unknown one is a 404 of its own.
        asked_at = datetime.now(UTC)
        extended, unknown = consumer.extend([first_id, "no-such-job"], 600)
        assert (extended["ID"], extended["Status"], extended["State"]) == (
            first_id,
            202,
            "INFLIGHT",
        )
        lease_ends = datetime.fromisoformat(extended["LeaseExpiresAt"])
        assert lease_ends > asked_at + timedelta(seconds=300)  # not the claim's 30 s
        assert unknown["Status"] == 404

        results = consumer.report(
            [
                {"ID": first_id, "NextState": "DELIVERED"},
                {"ID": second_id, "NextState": "QUEUED", "Attempted": False},
            ]
        )
        assert [(result["ID"], result["Status"]) for result in results] == [
            (first_id, 202),
            (second_id, 202),
        ]
        assert pull.job(first)["Status"] == "DELIVERED"

        # The job given back unattempted is due at once, its attempt not counted.
        again = consumer.claim(10, lease_seconds=30, wait=5)
        assert [(job["ID"], job["Attempts"]) for job in again.jobs] == [(second_id, 1)]
        consumer.report([{"ID": second_id, "NextState": "DELIVERED"}])
        assert consumer.claim(10).jobs == []
    assert pull.all_delivered([first, second])


def test_wrong_tokens_are_refused(broker: Broker) -> None:
    pull = pull_consumer(broker)
    with (
        PullConsumer(broker.url, pull.channel, pull.consumer, TOKEN, "wrong") as consumer,
        pytest.raises(Unauthorized),
    ):
        consumer.claim(1)


def test_attempts_fence_report_and_extend_to_the_claim(broker: Broker) -> None:
    pull = pull_consumer(broker)
    [message_id] = pull.publish(1)
    with PullConsumer(broker.url, pull.channel, pull.consumer, TOKEN, TOKEN) as consumer:
        [job] = consumer.claim(1, lease_seconds=30).jobs
        job_id, attempts = job["ID"], job["Attempts"]
        [kept] = consumer.extend([(job_id, attempts)], 60)
        assert kept["Status"] == 202
        # Another claim's Attempts neither extends nor moves the job.
        [stale] = consumer.extend([(job_id, attempts + 1)], 60)
        assert (stale["Status"], stale["State"]) == (409, "INFLIGHT")
        assert "claimed again" in stale["Error"]
        [refused] = consumer.report([{"ID": job_id, "NextState": "DELIVERED", "Attempts": 2}])
        assert refused["Status"] == 409
        assert pull.job(message_id)["Status"] == "INFLIGHT"
        [done] = consumer.report([{"ID": job_id, "NextState": "DELIVERED", "Attempts": attempts}])
        assert done["Status"] == 202
    assert pull.job(message_id)["Status"] == "DELIVERED"
