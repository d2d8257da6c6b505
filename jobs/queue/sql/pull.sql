------------------------------------------------------------------------------------------------
-- Pull consumers: a claim in one statement, an acknowledgement in one, a report's read and its
-- moves in one each. Pull workers ask over HTTP for batches of 50 to 500 jobs; what costs there
-- is the interpreter's work per job, so the statements return only what the answer and the log
-- lines need (docs/performance-history.md, "Pull: batch acknowledgement (issue 18)").
------------------------------------------------------------------------------------------------

-- fragment: proven_pull_consumer(also)
-- The pull consumer a request names, if its credentials are the ones given (types.PullCredentials):
-- the consumer the URL names, still a pull consumer, its channel's token digest the one given (an
-- ordinary comparison of digests, safe as in publish.sql), its stored token the text the caller
-- checked the token given against; `also`: a statement's further conditions. No row otherwise.
SELECT consumer.id
    FROM consumers_consumer consumer JOIN broker_channel channel ON channel.id = consumer.channel_id
    WHERE consumer.channel_id = %(channel)s AND consumer.public_id = %(consumer)s
        AND consumer.type = 'pull' AND consumer.token = %(stored_token)s
        AND channel.token_hash = %(channel_token)s {also}

-- fragment: proven_claimant
-- The consumer of a claim whose credentials the statement checks: as proven_pull_consumer, not
-- paused (a paused consumer is handed nothing) and with the ordering the caller chose the
-- statement by. None: the claim takes nothing, and the caller checks the request step by step.
({proven_pull_consumer(AND NOT consumer.paused AND consumer.ordering = %(ordering)s)})

-- fragment: pull_claim(claimant, head_of_key)
-- The pull claim: the best due jobs of the consumer `claimant` gives, locked (skipping those
-- another worker is taking), moved to INFLIGHT under the lease with one attempt more, and
-- returned with their messages (queries.CLAIMED_JOB_FIELDS, CLAIMED_MESSAGE_FIELDS). MATERIALIZED
-- with the LIMIT: docs/queue-design.md (PostgreSQL bug #15715). Rows are matched on the whole
-- primary key, (id, partition_at), as in the push claim.
WITH due AS MATERIALIZED (
    SELECT j.id, j.partition_at
    FROM jobs_job j
    WHERE j.consumer_id = {claimant} AND j.status = 'QUEUED'
        AND j.next_attempt_at <= %(now)s {head_of_key}
    ORDER BY j.priority DESC, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs_job j
SET status = 'INFLIGHT', status_changed_at = %(now)s, attempts = j.attempts + 1,
    lease_expires_at = %(lease_until)s, incremental_timeout = 0
FROM due, broker_message m
WHERE j.id = due.id AND j.partition_at = due.partition_at AND j.status = 'QUEUED'
    AND m.id = j.message_id
RETURNING {claimed_job_columns},
    {claimed_message_columns}

-- name: claim_for_pull
-- The claim of a consumer that is not ordered.
{pull_claim(%(consumer)s, )}

-- name: claim_heads_for_pull
-- The claim of an ordered consumer: only the head of each ordering key.
{pull_claim(%(consumer)s, {head_of_key})}

-- name: claim_for_pull_proven
-- The claim of a consumer that is not ordered, its credentials checked in the statement.
{pull_claim({proven_claimant}, )}

-- name: claim_heads_for_pull_proven
-- The claim of an ordered consumer, its credentials checked in the statement.
{pull_claim({proven_claimant}, {head_of_key})}

-- name: acknowledge_pull_job
-- A pull consumer's report on one job it holds (DELIVERED or DEAD), the request's credentials
-- checked in the same statement, as the publish statement checks a broadcast's
-- (proven_pull_consumer). Then the move, and what its
-- log line says of the job before it (`held`, read in the statement's snapshot), in one round
-- trip: a single acknowledgement costs what a broadcast does (docs/performance.md). Nothing moves
-- when a check fails, or the job is not the consumer's or not INFLIGHT: the caller then looks
-- into why, and answers as the checks made one by one would. The job is moved by its whole
-- primary key, (id, partition_at), as the claims match it: the UPDATE then visits its own
-- partition only (pruned at run time), not every partition's key index.
WITH consumer AS (
    {proven_pull_consumer()}
), held AS (
    SELECT job.id, job.partition_at, job.attempts, job.status_changed_at, message.public_id,
        message.channel_id, message.traceparent, message.tracestate
    FROM consumer, jobs_job job JOIN broker_message message ON message.id = job.message_id
    WHERE job.id = %(job)s AND job.consumer_id = consumer.id
        AND job.created_at >= %(created_from)s AND job.created_at < %(created_until)s
)
UPDATE jobs_job job
SET status = %(target)s, status_changed_at = %(now)s, lease_expires_at = NULL,
    last_error = %(reason)s
FROM held
WHERE job.id = held.id AND job.partition_at = held.partition_at AND job.status = 'INFLIGHT'
RETURNING held.attempts, held.status_changed_at, held.public_id, held.channel_id,
    held.traceparent, held.tracestate

-- name: lock_reported
-- A report's read: the consumer's jobs among those named, locked in key order (two reports never
-- deadlock): its key and creation time (its public ID), its state, then types.HELD_COLUMNS.
SELECT job.id, job.created_at, job.status, job.attempts, job.status_changed_at,
    message.public_id, message.channel_id, message.traceparent, message.tracestate
FROM jobs_job job JOIN broker_message message ON message.id = job.message_id
WHERE job.consumer_id = %(consumer)s AND job.id = ANY(%(keys)s::bigint[])
ORDER BY job.id
FOR UPDATE OF job

-- name: apply_pull_moves
-- A report's moves, whatever their targets, in one conditional UPDATE: each job's own state, last
-- error and (QUEUED) due time, and the claim's attempt taken back for a job given back unstarted;
-- jobs no longer INFLIGHT are left alone and not counted.
UPDATE jobs_job job
SET status = move.target, status_changed_at = %(now)s, lease_expires_at = NULL,
    last_error = move.reason, next_attempt_at = coalesce(move.due_at, job.next_attempt_at),
    attempts = CASE WHEN move.refund THEN greatest(job.attempts - 1, 0) ELSE job.attempts END
FROM unnest(%(keys)s::bigint[], %(targets)s::text[], %(reasons)s::text[],
    %(due)s::timestamptz[], %(refunds)s::boolean[]) AS move(id, target, reason, due_at, refund)
WHERE job.id = move.id AND job.status = 'INFLIGHT'

-- name: extend_leases
-- A pull worker still busy with jobs it holds: each INFLIGHT job's lease ends at its own time now.
UPDATE jobs_job job SET lease_expires_at = lease.until
FROM unnest(%(keys)s::bigint[], %(untils)s::timestamptz[]) AS lease(id, until)
WHERE job.id = lease.id AND job.status = 'INFLIGHT'
