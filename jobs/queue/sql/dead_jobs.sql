------------------------------------------------------------------------------------------------
-- The dead-letter queue in batches (jobs/queue/dead_jobs.py): a batch picks its jobs (a range of
-- one consumer's dead-letter queue, or a few given keys), then requeues or purges them.
------------------------------------------------------------------------------------------------

-- fragment: dead_range
-- A range is read from job_consumer_dead_idx (consumer, status_changed_at) WHERE status = 'DEAD'
-- (a literal, so that even a generic plan of a prepared statement matches the partial index):
-- `since` moves on with every batch, so no batch walks again through the index entries of the
-- jobs that earlier batches took. (For a queue smaller than a batch the planner may rather read
-- the consumer's jobs and sort them: as cheap then.)
SELECT id, partition_at, created_at, status_changed_at FROM jobs_job
WHERE consumer_id = %(consumer)s AND status = 'DEAD'
    AND status_changed_at >= %(since)s AND status_changed_at < %(before)s
ORDER BY status_changed_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- fragment: dead_keys
-- An operator's selection: those of the given keys that are DEAD.
SELECT id, partition_at, created_at, status_changed_at FROM jobs_job
WHERE id = ANY(%(keys)s::bigint[]) AND status = 'DEAD'
FOR UPDATE SKIP LOCKED

-- fragment: picked
-- The picked jobs are named to the statements that change them by arrays of their keys
-- (`= ANY(ARRAY(...))`), so that each reads them by its primary key or attempt_job_idx whatever
-- row count the planner guessed for the batch.
ANY(ARRAY(SELECT id FROM picked))

-- fragment: picked_jobs
-- The range of the picked jobs' time partitions is named too (a range: PostgreSQL prunes
-- partitions by it as the statement runs, but not by an array of values): it then reads only
-- those partitions, where by id alone it probed every partition's index for every job
-- (docs/performance-history.md). The jobs stay locked from the pick on, so `status = 'DEAD'`
-- holds for each; it is the state machine's condition all the same (JobQuerySet.transition).
id = {picked} AND status = 'DEAD'
    AND partition_at BETWEEN (SELECT min(partition_at) FROM picked)
        AND (SELECT max(partition_at) FROM picked)

-- fragment: purge_picked
-- A dead job's attempts started after it was created and before it died: only the attempt
-- partitions between the batch's oldest creation and latest death are read (CLOCK_ALLOWANCE
-- wider each way, for the clocks of other hosts). An attempt recorded more than that after its
-- job died (by a dispatcher stalled for a day) is left behind, an orphan row that goes with its
-- partition.
attempts AS (
    DELETE FROM jobs_deliveryattempt WHERE job_id = {picked}
        AND started_at >= (SELECT min(created_at) FROM picked) - interval '{clock_allowance_seconds} seconds'
        AND started_at <= (SELECT max(status_changed_at) FROM picked) + interval '{clock_allowance_seconds} seconds'
),
taken AS (DELETE FROM jobs_job WHERE {picked_jobs} RETURNING 1)

-- fragment: requeue_picked
-- The state machine's DEAD -> QUEUED (JobQuerySet.requeue_dead): `requeue_assignments`, a slot
-- the caller fills, sets its columns from parameters.
taken AS (
    UPDATE jobs_job SET status = 'QUEUED', {requeue_assignments}
    WHERE {picked_jobs} RETURNING 1
)

-- fragment: dead_batch(picked_by, action)
-- A batch: how many jobs it picked, how many it took, and when the latest of them died.
WITH picked AS ({picked_by}), {action}
SELECT (SELECT count(*) FROM picked), (SELECT count(*) FROM taken),
    (SELECT max(status_changed_at) FROM picked)

-- name: requeue_dead_range
-- The next jobs of a dead-letter queue back to the queue.
{dead_batch({dead_range}, {requeue_picked})}

-- name: requeue_dead_keys
-- Dead jobs of an operator's selection back to the queue.
{dead_batch({dead_keys}, {requeue_picked})}

-- name: purge_dead_range
-- The next jobs of a dead-letter queue deleted, with their attempts.
{dead_batch({dead_range}, {purge_picked})}

-- name: purge_dead_keys
-- Dead jobs of an operator's selection deleted, with their attempts.
{dead_batch({dead_keys}, {purge_picked})}

-- name: count_dead_range
-- How many jobs a range of one consumer's dead-letter queue holds now (an index range of
-- job_consumer_dead_idx).
SELECT count(*) FROM jobs_job
WHERE consumer_id = %(consumer)s AND status = 'DEAD'
    AND status_changed_at >= %(since)s AND status_changed_at < %(before)s
