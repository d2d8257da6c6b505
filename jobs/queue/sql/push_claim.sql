------------------------------------------------------------------------------------------------
-- Push: the dispatchers' claim (jobs/queue/postgres.py)
------------------------------------------------------------------------------------------------

-- name: claim_for_push
-- The push claim:
-- - paced: the rate-limited consumers that may receive, have a job due and a slot free within the
--   horizon (rules.SLOT_HORIZON_SECONDS); a consumer's first slot is its next one, or now if that
--   has passed (slots left unused are not saved up: no burst follows a quiet spell). Their rows
--   are locked, so that claims of several dispatchers book one consumer's slots one after
--   another; a row another transaction holds is skipped (its consumer gets nothing from this
--   claim, and no claim ever waits). A row locked is read as the last commit left it (PostgreSQL
--   re-reads it), so a claim books after the one before, and skips the consumer if no slot is
--   free any more. FOR NO KEY UPDATE leaves publishers' foreign-key checks unblocked. A consumer
--   booked up to the horizon, the usual case between two of its slots, is not locked at all;
-- - cap, room: each consumer's free in-flight slots, for push consumers that may receive
--   (`receiving`), under its cap (`in_flight_cap`), no more than the claiming dispatcher's room
--   for it (types.ClaimRooms: `new_room` for one it does not know), and for a paced one no more
--   than its bookable slots (those, 1/per_second apart from its first slot, that begin within
--   the horizon). Counted once per claim (hence MATERIALIZED), and only up to the cap: a plain
--   index scan that stops there, and that marks the dead index entries of finished jobs as it
--   passes, so that the next claim skips them;
-- - due: per consumer, its best due jobs up to its room, read from an index without locks. For an
--   ordered consumer only the head of each key qualifies (a key's messages go one at a time, in
--   order): the key's pending job with the lowest id, when it is QUEUED and due. The heads are
--   found by walking the consumer's keys through job_consumer_key_pending_idx, one index probe
--   per key, so the cost grows with the number of keys with pending jobs, not with the backlog
--   behind them. Each job has its `turn` among its consumer's: first, second, ...;
-- - taking_turns, candidate: the best of those overall, by priority, then taking turns between
--   consumers (every consumer's first job before anybody's second), then due time: a consumer
--   with a long backlog does not push a newer consumer's jobs to later claims. The jobs of
--   consumers new to the dispatcher count against its `new_budget`, all of them together. Twice
--   the batch is read, so that rows a concurrent dispatcher holds can be skipped without coming
--   back short;
-- - taken: those rows locked, skipping any already locked, up to the batch size. Found by the
--   whole primary key, (id, partition_at): by id alone the planner, misled by the statistics of a
--   young partition (taken while no job waited), walked a partial index for each candidate and
--   the empty-table drain fell from about 2,600 to 600 jobs/s (docs/performance-history.md). The
--   whole key was not enough while `status = 'QUEUED'` stood beside it: with statistics that put
--   one QUEUED job in the partition, the claim's prepared statement (a generic plan) scanned a
--   whole partial index of QUEUED jobs for each candidate, 18,000 entries each while a frozen
--   dispatcher held vacuum back (bench/isolation.py's sigstop row: claims of 300-800 ms). So
--   each candidate is looked up in a LATERAL subquery by its key alone, which no partial index
--   serves (a primary-key probe), locked there, and its status is checked outside once locked
--   (LIMIT 1 keeps that check out of the subquery);
-- - slotted: a paced consumer's jobs get its next slots in their order, 1/per_second apart, and
--   booked moves its next free slot past them: only the jobs taken use slots;
-- - the UPDATE (by the whole key alone, as taken: those rows are locked and QUEUED) moves them
--   to INFLIGHT with a lease and the dispatcher's name (claimed_by: its jobs go back early if it
--   dies, jobs/queue/dispatchers.py), counts the attempt and returns the columns of
--   types.CLAIM_COLUMNS and the send time.
-- Every read of jobs_job carries {claimable}: the partitions below the lower bound of
-- jobs/partitions/pending.py hold no pending job, and PostgreSQL leaves them out when it plans,
-- so that the claim costs the same with 2 partitions or 94 (a job is found by status and
-- consumer, neither of which is the partition key).
-- A consumer's cap holds per claim; claims of several dispatchers at the same moment can each
-- fill the same room (docs/dispatcher.md). Its rate holds across them all.
WITH paced AS MATERIALIZED (
    SELECT c.id, c.max_per_second AS per_second,
        greatest(c.next_slot_at, %(now)s) AS first_slot
    FROM consumers_consumer c
    WHERE c.max_per_second IS NOT NULL AND {receiving}
        AND (c.next_slot_at IS NULL OR c.next_slot_at < %(now)s + {horizon})
        AND EXISTS (
            SELECT FROM jobs_job j
            WHERE j.consumer_id = c.id AND j.status = 'QUEUED'
                AND j.next_attempt_at <= %(now)s AND {claimable(j)}
        )
    FOR NO KEY UPDATE OF c SKIP LOCKED
),
cap AS (
    SELECT c.id, c.ordering = 'ordered' AS ordered,
        {in_flight_cap} AS cap,
        ceil((extract(epoch FROM %(now)s - paced.first_slot) + {slot_horizon_seconds})
            * paced.per_second)::int AS bookable
    FROM consumers_consumer c LEFT JOIN paced ON paced.id = c.id
    WHERE {receiving} AND (c.max_per_second IS NULL OR paced.id IS NOT NULL)
),
room AS MATERIALIZED (
    SELECT cap.id, cap.ordered, coalesce(mine.new, true) AS new,
        least(cap.bookable, coalesce(mine.room, %(new_room)s), cap.cap - (
            SELECT count(*) FROM (
                SELECT FROM jobs_job f
                WHERE f.consumer_id = cap.id AND f.status = 'INFLIGHT' AND {claimable(f)}
                LIMIT cap.cap
            ) in_flight
        )) AS free
    FROM cap LEFT JOIN unnest(%(room_consumers)s::bigint[], %(rooms)s::int[], %(new)s::bool[])
        AS mine(id, room, new) ON mine.id = cap.id
),
due AS (
    SELECT next.id, next.partition_at, next.priority, next.next_attempt_at, next.turn, room.new
    FROM room CROSS JOIN LATERAL (
        SELECT j.id, j.partition_at, j.priority, j.next_attempt_at,
            row_number() OVER (ORDER BY j.priority DESC, j.next_attempt_at) AS turn
        FROM jobs_job j
        WHERE j.consumer_id = room.id AND j.status = 'QUEUED'
            AND j.next_attempt_at <= %(now)s AND {claimable(j)}
        ORDER BY j.priority DESC, j.next_attempt_at
        LIMIT least(room.free, %(candidates)s)
    ) next
    WHERE room.free > 0 AND NOT room.ordered
    UNION ALL
    SELECT head.id, head.partition_at, head.priority, head.next_attempt_at, head.turn, room.new
    FROM room CROSS JOIN LATERAL (
        WITH RECURSIVE key_head AS (
            (SELECT j.ordering_key, j.id, j.partition_at, j.status, j.priority, j.next_attempt_at
             FROM jobs_job j
             WHERE j.consumer_id = room.id AND j.status IN {pending} AND {claimable(j)}
             ORDER BY j.ordering_key, j.id LIMIT 1)
            UNION ALL
            SELECT next_key.*
            FROM key_head CROSS JOIN LATERAL (
                SELECT j.ordering_key, j.id, j.partition_at, j.status, j.priority,
                    j.next_attempt_at
                FROM jobs_job j
                WHERE j.consumer_id = room.id AND j.status IN {pending} AND {claimable(j)}
                    AND j.ordering_key > key_head.ordering_key
                ORDER BY j.ordering_key, j.id LIMIT 1
            ) next_key
        )
        SELECT id, partition_at, priority, next_attempt_at,
            row_number() OVER (ORDER BY priority DESC, next_attempt_at) AS turn
        FROM key_head
        WHERE status = 'QUEUED' AND next_attempt_at <= %(now)s
        ORDER BY priority DESC, next_attempt_at
        LIMIT least(room.free, %(candidates)s)
    ) head
    WHERE room.free > 0 AND room.ordered
),
taking_turns AS (
    SELECT due.*, count(*) FILTER (WHERE due.new) OVER (
        ORDER BY due.priority DESC, due.turn, due.next_attempt_at ROWS UNBOUNDED PRECEDING
    ) AS new_so_far
    FROM due
),
candidate AS (
    SELECT * FROM taking_turns WHERE NOT new OR new_so_far <= %(new_budget)s
    ORDER BY priority DESC, turn, next_attempt_at LIMIT %(candidates)s
),
taken AS MATERIALIZED (
    SELECT j.id, j.partition_at, j.consumer_id, candidate.priority, candidate.next_attempt_at
    FROM candidate CROSS JOIN LATERAL (
        SELECT j.id, j.partition_at, j.consumer_id, j.status FROM jobs_job j
        WHERE j.id = candidate.id AND j.partition_at = candidate.partition_at
            AND {claimable(j)}
        LIMIT 1
        FOR UPDATE OF j SKIP LOCKED
    ) j
    WHERE j.status = 'QUEUED'
    ORDER BY candidate.priority DESC, candidate.turn, candidate.next_attempt_at
    LIMIT %(limit)s
),
slotted AS (
    SELECT taken.id, taken.partition_at,
        paced.first_slot + make_interval(secs => (row_number() OVER (
            PARTITION BY taken.consumer_id
            ORDER BY taken.priority DESC, taken.next_attempt_at, taken.id
        ) - 1) / paced.per_second) AS send_at
    FROM taken LEFT JOIN paced ON paced.id = taken.consumer_id
),
booked AS (
    UPDATE consumers_consumer c
    SET next_slot_at = paced.first_slot + make_interval(secs => used.slots / paced.per_second)
    FROM paced JOIN (
        SELECT consumer_id, count(*) AS slots FROM taken GROUP BY consumer_id
    ) used ON used.consumer_id = paced.id
    WHERE c.id = paced.id
)
UPDATE jobs_job j
SET status = 'INFLIGHT', status_changed_at = %(now)s, attempts = j.attempts + 1,
    lease_expires_at = %(lease_until)s, claimed_by = %(dispatcher)s
FROM slotted, broker_message m, consumers_consumer c
WHERE j.id = slotted.id AND j.partition_at = slotted.partition_at AND {claimable(j)}
    AND m.id = j.message_id AND c.id = j.consumer_id
RETURNING j.id, j.partition_at, j.attempts, j.priority, j.next_attempt_at, c.id, c.changed_at,
    j.created_at, m.public_id, m.payload, m.payload_file, m.content_type, m.priority, m.headers,
    m.traceparent, m.tracestate, m.event_type, slotted.send_at

-- fragment: claimable(job)
-- The partitions of jobs that can hold pending work (jobs/partitions/pending.py): a lower bound
-- of the partition key, by which PostgreSQL prunes the others as it plans the claim for its
-- values (a custom plan: a generic one would be planned over every partition).
{job}.partition_at >= %(pending_from)s
