------------------------------------------------------------------------------------------------
-- The circuit breaker (jobs/queue/circuit.py owns the rule; docs/delivery.md, "Circuit
-- breaker"): which consumers may receive and their cap are fragments of the push claim
-- (`receiving`, `in_flight_cap`; push_claim.sql); the counting, opening and closing are
-- `consumer_outcomes`, a part of record_outcomes (outcomes.sql).
------------------------------------------------------------------------------------------------

-- fragment: receiving
-- The push consumers `c` that may receive now: not paused, not throttled by a 429's Retry-After,
-- their circuit closed or half-open (jobs/queue/circuit.py: its cooldown over).
c.type = 'push' AND NOT c.paused
    AND (c.circuit_open_until IS NULL OR c.circuit_open_until <= %(now)s)
    AND (c.throttled_until IS NULL OR c.throttled_until <= %(now)s)

-- fragment: in_flight_cap
-- How many jobs the push consumer `c` may have INFLIGHT: its maxInFlight, or
-- rules.DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER; one, the probe, while its circuit is half-open
-- (jobs/queue/circuit.py).
CASE WHEN c.circuit_open_until IS NULL
            THEN coalesce(c.max_in_flight, {default_max_in_flight}) ELSE 1 END

-- fragment: consumer_outcomes
-- A batch's changes to its consumers' rows, one row each (a statement may not change a row
-- twice), from the statement's `present` jobs.
-- - change: per consumer of the batch, whether it answered (%(answered)s: a 2xx, or a 4xx of its
--   own, anywhere in the batch: its circuit closes), and from its jobs still present (a job
--   deleted meanwhile counts for nothing) how many attempts found it unavailable (and not
--   answered elsewhere in the batch), its newest failure (the first in the batch of those
--   started last), the hold of its last 429 in the batch, and whether it answered 410. Each
--   consumer's row needs the whole of `present` aggregated: no consumer is locked before every
--   job is (record_outcomes);
-- - locked: the rows that change, locked FOR NO KEY UPDATE SKIP LOCKED: a row another
--   transaction holds (another recording, a claim booking slots, an operator's edit, a process
--   frozen mid-transaction) is skipped, never waited for (issue 36), so the order they are
--   locked in does not matter: its failures go uncounted and its circuit is not closed by this
--   batch; publishers' foreign-key checks never wait for these locks. The usual case, a healthy
--   consumer that answered, locks and writes nothing;
-- - opens_for: the cooldown of a circuit that opens now. A consumer whose circuit is half-open
--   (its cooldown over) was sent one probe: if unavailable it opens again for twice as long, at
--   most %(max_cooldown)s; a closed circuit opens for %(cooldown)s when its failures in a row
--   reach %(threshold)s (0: never); an open one only counts (deliveries sent before it opened);
-- - changed: the new circuit, the newest failure unless a newer one is there (another
--   dispatcher's), the latest hold, the pause.
change AS (
    SELECT consumer.id, consumer.answered,
        count(present.id) FILTER (WHERE present.unavailable)::int AS unavailable,
        max(present.failed_at) AS failed_at,
        (array_agg(present.failure ORDER BY present.failed_at DESC, present.place)
            FILTER (WHERE present.failed_at IS NOT NULL))[1] AS failure,
        (array_agg(present.throttled_until ORDER BY present.place DESC)
            FILTER (WHERE present.throttled_until IS NOT NULL))[1] AS throttled_until,
        coalesce(bool_or(present.pause), false) AS pause
    FROM unnest(%(consumers)s::bigint[], %(answered)s::bool[]) AS consumer(id, answered)
        LEFT JOIN present ON present.consumer_id = consumer.id
    GROUP BY consumer.id, consumer.answered
),
locked AS MATERIALIZED (
    SELECT c.id, c.channel_id, c.public_id, change.answered, change.unavailable,
        change.failed_at, change.failure, change.throttled_until, change.pause,
        change.failed_at IS NOT NULL AND (c.last_failure_at IS NULL
            OR c.last_failure_at < change.failed_at) AS newer_failure,
        coalesce(c.circuit_open_until <= %(now)s, false) AS probe,
        CASE WHEN change.unavailable = 0 THEN 0
            WHEN c.circuit_open_until <= %(now)s THEN least(
                2 * greatest(c.circuit_cooldown_seconds, %(cooldown)s), %(max_cooldown)s)
            WHEN c.circuit_open_until IS NULL AND %(threshold)s > 0
                AND c.circuit_failures + change.unavailable >= %(threshold)s THEN %(cooldown)s
            ELSE 0 END AS opens_for
    FROM change CROSS JOIN LATERAL (
            SELECT c.id, c.channel_id, c.public_id, c.circuit_failures, c.circuit_open_until,
                c.circuit_cooldown_seconds, c.last_failure_at
            FROM consumers_consumer c
            WHERE c.id = change.id AND (change.unavailable > 0 OR change.pause
                OR change.answered AND (c.circuit_failures > 0 OR c.circuit_open_until IS NOT NULL)
                OR change.failed_at IS NOT NULL AND (c.last_failure_at IS NULL
                    OR c.last_failure_at < change.failed_at)
                OR change.throttled_until IS NOT NULL AND (c.throttled_until IS NULL
                    OR c.throttled_until < change.throttled_until))
            FOR NO KEY UPDATE SKIP LOCKED
        ) c
),
changed AS (
    UPDATE consumers_consumer c
    SET circuit_failures = CASE WHEN locked.answered THEN 0
            ELSE c.circuit_failures + locked.unavailable END,
        circuit_open_until = CASE WHEN locked.answered THEN NULL
            WHEN locked.opens_for > 0 THEN %(now)s + make_interval(secs => locked.opens_for)
            ELSE c.circuit_open_until END,
        circuit_cooldown_seconds = CASE WHEN locked.answered THEN 0
            WHEN locked.opens_for > 0 THEN locked.opens_for ELSE c.circuit_cooldown_seconds END,
        last_failure_at = CASE WHEN locked.newer_failure THEN locked.failed_at
            ELSE c.last_failure_at END,
        last_failure = CASE WHEN locked.newer_failure THEN locked.failure
            ELSE c.last_failure END,
        throttled_until = greatest(c.throttled_until, locked.throttled_until),
        paused = c.paused OR locked.pause
    FROM locked
    WHERE c.id = locked.id
    RETURNING c.id, locked.channel_id, locked.public_id, locked.probe, locked.opens_for,
        c.circuit_open_until
)

-- name: close_circuit
-- An operator closes a consumer's circuit: delivery resumes with the next claim.
UPDATE consumers_consumer
SET circuit_failures = 0, circuit_open_until = NULL, circuit_cooldown_seconds = 0
WHERE id = %(consumer)s
