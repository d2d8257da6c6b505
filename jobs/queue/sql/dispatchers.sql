------------------------------------------------------------------------------------------------
-- Dispatchers known dead (jobs/queue/dispatchers.py)
------------------------------------------------------------------------------------------------

-- fragment: session_name(dispatcher_id)
-- The application_name of the dispatcher whose ID is the SQL expression `dispatcher_id`, within
-- PostgreSQL's 63 characters whatever the ID: the one rule, for the session that takes the name
-- and for the query that looks for it.
'{session_prefix}' || left(md5({dispatcher_id}), 16)

-- name: name_session
-- A dispatcher's LISTEN connection takes its name (jobs/queue/wakeup.py).
SELECT set_config('application_name', {session_name(%(dispatcher)s)}, false)

-- name: bury_dead_dispatchers
-- Both clauses of dispatchers.py's rule: the dead dispatchers' heartbeats go, and say whose they
-- were.
DELETE FROM jobs_dispatcherheartbeat beat
WHERE beat.dispatcher_id <> %(me)s AND beat.last_beat_at < %(silent_since)s
    AND (beat.last_beat_at < %(frozen_since)s OR NOT EXISTS (
        SELECT FROM pg_stat_activity session
        WHERE session.application_name = {session_name(beat.dispatcher_id)}
    ))
RETURNING beat.dispatcher_id

-- name: end_their_leases
-- Their jobs' leases end now. The jobs are locked first (a frozen dispatcher's own transaction
-- may hold some: they are left to their leases); no statement of the broker waits for another's
-- lock.
WITH held AS (
    SELECT j.id, j.partition_at FROM jobs_job j
    WHERE j.status = 'INFLIGHT' AND j.claimed_by = ANY(%(dead)s)
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE jobs_job j SET lease_expires_at = %(now)s
FROM held WHERE j.id = held.id AND j.partition_at = held.partition_at
    AND j.lease_expires_at > %(now)s
