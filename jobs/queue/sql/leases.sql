------------------------------------------------------------------------------------------------
-- Leases, unsent jobs and the age limit (jobs/queue/leases.py, outcomes.py, expiry.py)
------------------------------------------------------------------------------------------------

-- name: any_expired_lease
-- Whether any INFLIGHT job's lease has run out: the usual answer, no, costs one look, and no
-- transaction.
SELECT EXISTS (
    SELECT FROM jobs_job WHERE status = 'INFLIGHT' AND lease_expires_at < %(now)s
)

-- name: lock_expired_leases
-- Up to a batch of INFLIGHT jobs whose lease has run out, locked; those another transaction
-- holds (a frozen dispatcher's recording, say) are skipped, not waited for: the sweep runs in the
-- dispatcher's claiming thread. Each with its consumer and the attempts it has used, which
-- decide where it goes (Consumer.max_attempts).
SELECT j.id, j.partition_at, j.consumer_id, j.attempts FROM jobs_job j
WHERE j.status = 'INFLIGHT' AND j.lease_expires_at < %(now)s
LIMIT %(batch)s
FOR UPDATE OF j SKIP LOCKED

-- name: end_expired_leases
-- The locked jobs back to QUEUED, due now, or DEAD when they have used all their attempts
-- (`targets`), each with its last error; the lease condition again, so that a job leased again
-- since it was read is not touched. By the whole primary key.
UPDATE jobs_job j
SET status = move.target, status_changed_at = %(changed_at)s, lease_expires_at = NULL,
    last_error = move.reason,
    next_attempt_at = CASE WHEN move.target = 'QUEUED' THEN %(now)s ELSE j.next_attempt_at END
FROM unnest(%(jobs)s::bigint[], %(partitions)s::timestamptz[], %(targets)s::text[],
    %(reasons)s::text[]) AS move(id, partition_at, target, reason)
WHERE j.id = move.id AND j.partition_at = move.partition_at AND j.status = 'INFLIGHT'
    AND j.lease_expires_at < %(now)s

-- name: release_unsent
-- Claimed jobs never sent go back to the queue in their place (the due time they were claimed
-- at) without using an attempt, by their whole primary keys as the claim returned them; only
-- those still INFLIGHT. The jobs are looked up one primary-key probe each, in a LATERAL subquery
-- that locks them in the order of the keys given (so that it is not flattened into a join over
-- every partition: see record_outcomes). FOR NO KEY UPDATE, the lock the UPDATE itself takes
-- (no key changes): a key-share lock on the job (a recording's `present`) neither waits for it
-- nor holds it up.
WITH unsent AS MATERIALIZED (
    SELECT j.id, j.partition_at
    FROM unnest(%(jobs)s::bigint[], %(partitions)s::timestamptz[]) AS given(id, partition_at)
        CROSS JOIN LATERAL (
            SELECT j.id, j.partition_at FROM jobs_job j
            WHERE j.id = given.id AND j.partition_at = given.partition_at
            FOR NO KEY UPDATE
        ) j
)
UPDATE jobs_job j
SET status = 'QUEUED', status_changed_at = %(changed_at)s, attempts = j.attempts - 1,
    lease_expires_at = NULL
FROM unsent
WHERE j.id = unsent.id AND j.partition_at = unsent.partition_at AND j.status = 'INFLIGHT'

-- name: expire_old_jobs
-- The age limit (jobs/queue/expiry.py): per push consumer that is not paused and has a limit
-- (its own maxJobAge, else %(default_seconds)s; 0: none), up to a batch of its jobs QUEUED since
-- before that limit, one index probe each (job_consumer_queued_age_idx), so a sweep costs the
-- same however long the queues are; they go DEAD with a last error that says why, the job's own
-- last error kept after it. The status and age again on the row: a job claimed or requeued since
-- it was read is left alone.
WITH limited AS (
    SELECT c.id, coalesce(c.max_job_age, %(default_seconds)s) AS seconds
    FROM consumers_consumer c
    WHERE c.type = 'push' AND NOT c.paused AND coalesce(c.max_job_age, %(default_seconds)s) > 0
), expired AS MATERIALIZED (
    SELECT old.id, old.partition_at, old.cutoff, limited.seconds
    FROM limited CROSS JOIN LATERAL (
        SELECT j.id, j.partition_at, %(now)s - make_interval(secs => limited.seconds) AS cutoff
        FROM jobs_job j
        WHERE j.consumer_id = limited.id AND j.status = 'QUEUED'
            AND j.enqueued_at < %(now)s - make_interval(secs => limited.seconds)
        LIMIT %(batch)s
    ) old
)
UPDATE jobs_job j
SET status = 'DEAD', status_changed_at = %(changed_at)s,
    last_error = %(expired)s || ': not delivered within ' || expired.seconds
        || ' s of being queued' || CASE WHEN j.last_error = '' THEN ''
            ELSE '; last error: ' || j.last_error END
FROM expired
WHERE j.id = expired.id AND j.partition_at = expired.partition_at AND j.status = 'QUEUED'
    AND j.enqueued_at < expired.cutoff

-- name: restart_age
-- A consumer's waiting jobs count their age from now (it was resumed, or became a push
-- consumer): time it could not receive in is not held against them.
UPDATE jobs_job SET enqueued_at = %(now)s WHERE consumer_id = %(consumer)s AND status = 'QUEUED'
