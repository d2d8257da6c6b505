------------------------------------------------------------------------------------------------
-- Push: the outcomes of the dispatchers' attempts (jobs/queue/outcomes.py)
------------------------------------------------------------------------------------------------

-- name: record_outcomes
-- Every outcome of a batch of push attempts in one statement, one round trip whatever the batch
-- holds (jobs/queue/outcomes.py builds its parameters): an attempt row each, each job moved to
-- the state its outcome says (DELIVERED; QUEUED again at its due time; DEAD), and each consumer's
-- row brought up to date (`consumer_outcomes`: its circuit, its last failure, a 429's hold, a
-- 410's pause). Only jobs still INFLIGHT under the claim the result is of (the same attempt
-- count) move: one whose lease expired and was swept, and perhaps taken again, meanwhile is left
-- to the queue or its new holder (its duplicate delivery is the at-least-once price); its attempt
-- is recorded all the same. A job deleted meanwhile (with its consumer or message) gets no
-- attempt row: `present` locks the jobs against deletion before anything else touches them (a
-- row this statement had already updated could not be locked). Every job goes by the whole
-- primary key the claim returned, (id, partition_at), as in the claim: by id alone each job
-- probed every time partition's index. A job that retention carried forward meanwhile (possible
-- only once its lease expired and the sweep gave it back) counts as gone: it gets no attempt row.
-- - present locks the jobs, in the order of the arrays: their keys' order (outcomes.py sorts
--   them), so that statements locking the same jobs wait for each other rather than deadlock.
--   It looks each job up in a LATERAL subquery that holds the lock (so it cannot be
--   flattened into a join the planner may turn into a hash join over every partition, as it did
--   with 40 jobs and 3,000-row partitions): EXPLAIN ANALYZE on 13 partitions (DEFAULT
--   included), with statistics fresh or taken while no job was in flight, and in a generic plan
--   too, runs one primary-key probe per job in its own partition, every other partition "never
--   executed" (run-time pruning). tests/queue/test_whole_key_outcomes.py checks what it reads;
-- - moved joins present on the whole key, and its `partition_at = ANY(...)` of the batch's
--   partitions prunes the others when the statement is planned with its values (a custom plan:
--   one partition left of 13); a generic plan cannot prune on an array parameter, and reads
--   each partition's index of in-flight jobs once. A failed probe of a circuit that opens again
--   (`reopened`) uses no attempt: its job is QUEUED until the circuit half-opens again, its
--   error saying so (`probe_reason`), never that attempts were used up;
-- - the consumers' rows (`consumer_outcomes`) are changed from the outcomes of the jobs present
--   only, and are locked only once every job is: as a consumer's deletion locks them (its
--   attempts and jobs deleted first, then its row), so the two never deadlock;
-- - the answer: the jobs present, and the circuits that opened (jobs/queue/circuit.py logs them).
WITH present AS MATERIALIZED (
    SELECT j.id, j.partition_at, claimed.attempts, claimed.consumer_id, claimed.target,
        claimed.reason, claimed.due_at, claimed.refund, claimed.probe_reason, claimed.place,
        claimed.unavailable, claimed.failed_at, claimed.failure, claimed.throttled_until,
        claimed.pause
    FROM unnest(%(jobs)s::bigint[], %(partitions)s::timestamptz[], %(attempts)s::int[],
        %(job_consumers)s::bigint[], %(targets)s::text[], %(reasons)s::text[],
        %(due)s::timestamptz[], %(refunds)s::bool[], %(probe_reasons)s::text[],
        %(places)s::int[], %(unavailable)s::bool[], %(failed_at)s::timestamptz[],
        %(failures)s::text[], %(throttled_until)s::timestamptz[], %(pause)s::bool[])
        AS claimed(id, partition_at, attempts, consumer_id, target, reason, due_at, refund,
            probe_reason, place, unavailable, failed_at, failure, throttled_until, pause)
        CROSS JOIN LATERAL (
            SELECT j.id, j.partition_at FROM jobs_job j
            WHERE j.id = claimed.id AND j.partition_at = claimed.partition_at
            FOR KEY SHARE
        ) j
),
{consumer_outcomes},
reopened AS (
    SELECT id, circuit_open_until FROM changed WHERE probe AND opens_for > 0
),
moved AS (
    UPDATE jobs_job j
    SET status = CASE WHEN reopened.id IS NULL THEN present.target ELSE 'QUEUED' END,
        status_changed_at = %(now)s, lease_expires_at = NULL,
        last_error = CASE WHEN reopened.id IS NULL THEN present.reason
            ELSE present.probe_reason END,
        next_attempt_at = CASE WHEN reopened.id IS NULL
            THEN coalesce(present.due_at, j.next_attempt_at) ELSE reopened.circuit_open_until END,
        attempts = CASE WHEN reopened.id IS NULL AND NOT present.refund
            THEN j.attempts ELSE j.attempts - 1 END
    FROM present LEFT JOIN reopened
        ON reopened.id = present.consumer_id AND present.probe_reason IS NOT NULL
    WHERE j.id = present.id AND j.partition_at = present.partition_at
        AND j.partition_at = ANY(%(batch_partitions)s::timestamptz[])
        AND j.attempts = present.attempts AND j.status = 'INFLIGHT'
),
recorded AS (
    INSERT INTO jobs_deliveryattempt (job_id, consumer_id, attempt_number, started_at,
        duration_ms, status_code, error_class, response_excerpt, request_headers,
        response_headers, dispatcher_id)
    SELECT job_id, consumer_id, attempt_number, started_at, duration_ms, status_code,
        error_class, excerpt, request_headers, response_headers, %(dispatcher)s
    FROM unnest(%(jobs)s::bigint[], %(job_consumers)s::bigint[], %(attempts)s::int[],
        %(started)s::timestamptz[], %(durations)s::float8[], %(statuses)s::smallint[],
        %(error_classes)s::text[], %(excerpts)s::text[], %(request_headers)s::jsonb[],
        %(response_headers)s::jsonb[])
        AS result(job_id, consumer_id, attempt_number, started_at, duration_ms, status_code,
            error_class, excerpt, request_headers, response_headers)
    WHERE job_id IN (SELECT id FROM present)
)
SELECT (SELECT array_agg(id) FROM present), opened.consumers, opened.names, opened.seconds,
    opened.probes, opened.until
FROM (
    SELECT array_agg(id ORDER BY id) AS consumers,
        array_agg(channel_id || '/' || public_id ORDER BY id) AS names,
        array_agg(opens_for ORDER BY id) AS seconds, array_agg(probe ORDER BY id) AS probes,
        array_agg(circuit_open_until ORDER BY id) AS until
    FROM changed WHERE opens_for > 0
) AS opened
