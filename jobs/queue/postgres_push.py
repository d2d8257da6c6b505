"""The push side of the queue on PostgreSQL: the dispatchers' claim and the recording of their
2xx answers, one statement each (jobs/queue/postgres.py runs them; why they are shaped as they
are: docs/queue-design.md). Table names come from model metadata and code constants are
literals; every value is a parameter.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from broker.models import Message
from consumers.models import Consumer
from jobs.models import DeliveryAttempt, Job
from jobs.queue.rules import (
    DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER,
    SLOT_HORIZON_SECONDS,
    push_lease_expiry,
)
from jobs.queue.types import ClaimRooms
from jobs.states import DELIVERED, INFLIGHT, QUEUED

_JOB = Job._meta.db_table
_CONSUMER = Consumer._meta.db_table
_MESSAGE = Message._meta.db_table

# The push claim:
# - paced: the rate-limited consumers that may receive, have a job due and a slot free within the
#   horizon (rules.SLOT_HORIZON_SECONDS); a consumer's first slot is its next one, or now if that
#   has passed (slots left unused are not saved up: no burst follows a quiet spell). Their rows
#   are locked, so that claims of several dispatchers book one consumer's slots one after
#   another; a row another transaction holds is skipped (its
#   consumer gets nothing from this claim, and no claim ever waits). A row locked is read as the
#   last commit left it (PostgreSQL re-reads it), so a claim books after the one before, and
#   skips the consumer if no slot is free any more. FOR NO KEY UPDATE leaves publishers'
#   foreign-key checks unblocked. A consumer booked up to the horizon, the usual case between two
#   of its slots, is not locked at all;
# - cap, room: each consumer's free in-flight slots, for push consumers that may receive
#   (_RECEIVING: not paused, not throttled by a 429's Retry-After, the circuit closed or half-open,
#   its cooldown over), under its cap (its maxInFlight, or
#   rules.DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER; one probe while its circuit is half-open), no more
#   than the claiming dispatcher's room for it (types.ClaimRooms: `new_room` for one it does not
#   know), and for a paced one no more than its bookable slots (those, 1/per_second apart from its
#   first slot, that begin within the horizon). Counted once per claim (hence MATERIALIZED),
#   and only up to the cap: a plain index scan that stops there, and that marks
#   the dead index entries of finished jobs as it passes, so that the next claim skips them;
# - due: per consumer, its best due jobs up to its room, read from an index without locks. For an
#   ordered consumer only the head of each key qualifies (a key's messages go one at a time, in
#   order): the key's pending job with the lowest id, when it is QUEUED and due. The heads are
#   found by walking the consumer's keys through job_consumer_key_pending_idx, one index probe
#   per key, so the cost grows with the number of keys with pending jobs, not with the backlog
#   behind them;
#   Each job has its `turn` among its consumer's: first, second, ...;
# - taking_turns, candidate: the best of those overall, by priority, then taking turns between
#   consumers (every consumer's first job before anybody's second), then due time: a consumer with
#   a long backlog does not push a newer consumer's jobs to later claims. The jobs of consumers new
#   to the dispatcher count against its `new_budget`, all of them together. Twice the batch is
#   read, so that rows a concurrent dispatcher holds can be skipped without coming back short;
# - taken: those rows locked, skipping any already locked, up to the batch size. Found by the whole
#   primary key, (id, partition_at): by id alone the planner, misled by the statistics of a young
#   partition (taken while no job waited), walked a partial index for each candidate and the
#   empty-table drain fell from about 2,600 to 600 jobs/s (docs/performance-history.md). The whole
#   key was not enough while `status = 'QUEUED'` stood beside it: with statistics that put one
#   QUEUED job in the partition, the claim's prepared statement (a generic plan) scanned a whole
#   partial index of QUEUED jobs for each candidate, 18,000 entries each while a frozen
#   dispatcher held vacuum back (bench/isolation.py's sigstop row: claims of 300-800 ms). So
#   each candidate is looked up in a LATERAL subquery by its key alone, which no partial index
#   serves (a primary-key probe), locked there, and its status is checked outside once locked
#   (LIMIT 1 keeps that check out of the subquery);
# - slotted: a paced consumer's jobs get its next slots in their order, 1/per_second apart, and
#   booked moves its next free slot past them: only the jobs taken use slots;
# - the UPDATE (by the whole key alone, as taken: those rows are locked and QUEUED) moves them
#   to INFLIGHT with a lease and the dispatcher's name (claimed_by: its jobs
#   go back early if it dies, jobs/queue/dispatchers.py), counts the attempt and returns the
#   columns of types.CLAIM_COLUMNS and the send time.
# A consumer's cap holds per claim; claims of several dispatchers at the same moment can each fill
# the same room (docs/dispatcher.md). Its rate holds across them all.
_PENDING = f"('{QUEUED.value}', '{INFLIGHT.value}')"
_RECEIVING = f"""c.type = '{Consumer.Type.PUSH.value}' AND NOT c.paused
    AND (c.circuit_open_until IS NULL OR c.circuit_open_until <= %(now)s)
    AND (c.throttled_until IS NULL OR c.throttled_until <= %(now)s)"""
_HORIZON = f"interval '{SLOT_HORIZON_SECONDS} seconds'"
CLAIM_FOR_PUSH_SQL = f"""
WITH paced AS MATERIALIZED (
    SELECT c.id, c.max_per_second AS per_second,
        greatest(c.next_slot_at, %(now)s) AS first_slot
    FROM {_CONSUMER} c
    WHERE c.max_per_second IS NOT NULL AND {_RECEIVING}
        AND (c.next_slot_at IS NULL OR c.next_slot_at < %(now)s + {_HORIZON})
        AND EXISTS (
            SELECT FROM {_JOB} j
            WHERE j.consumer_id = c.id AND j.status = '{QUEUED.value}'
                AND j.next_attempt_at <= %(now)s
        )
    FOR NO KEY UPDATE OF c SKIP LOCKED
),
cap AS (
    SELECT c.id, c.ordering = '{Consumer.Ordering.ORDERED.value}' AS ordered,
        CASE WHEN c.circuit_open_until IS NULL
            THEN coalesce(c.max_in_flight, {DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER}) ELSE 1 END AS cap,
        ceil((extract(epoch FROM %(now)s - paced.first_slot) + {SLOT_HORIZON_SECONDS})
            * paced.per_second)::int AS bookable
    FROM {_CONSUMER} c LEFT JOIN paced ON paced.id = c.id
    WHERE {_RECEIVING} AND (c.max_per_second IS NULL OR paced.id IS NOT NULL)
),
room AS MATERIALIZED (
    SELECT cap.id, cap.ordered, coalesce(mine.new, true) AS new,
        least(cap.bookable, coalesce(mine.room, %(new_room)s), cap.cap - (
            SELECT count(*) FROM (
                SELECT FROM {_JOB} f
                WHERE f.consumer_id = cap.id AND f.status = '{INFLIGHT.value}'
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
        FROM {_JOB} j
        WHERE j.consumer_id = room.id AND j.status = '{QUEUED.value}'
            AND j.next_attempt_at <= %(now)s
        ORDER BY j.priority DESC, j.next_attempt_at
        LIMIT least(room.free, %(candidates)s)
    ) next
    WHERE room.free > 0 AND NOT room.ordered
    UNION ALL
    SELECT head.id, head.partition_at, head.priority, head.next_attempt_at, head.turn, room.new
    FROM room CROSS JOIN LATERAL (
        WITH RECURSIVE key_head AS (
            (SELECT j.ordering_key, j.id, j.partition_at, j.status, j.priority, j.next_attempt_at
             FROM {_JOB} j
             WHERE j.consumer_id = room.id AND j.status IN {_PENDING}
             ORDER BY j.ordering_key, j.id LIMIT 1)
            UNION ALL
            SELECT next_key.*
            FROM key_head CROSS JOIN LATERAL (
                SELECT j.ordering_key, j.id, j.partition_at, j.status, j.priority,
                    j.next_attempt_at
                FROM {_JOB} j
                WHERE j.consumer_id = room.id AND j.status IN {_PENDING}
                    AND j.ordering_key > key_head.ordering_key
                ORDER BY j.ordering_key, j.id LIMIT 1
            ) next_key
        )
        SELECT id, partition_at, priority, next_attempt_at,
            row_number() OVER (ORDER BY priority DESC, next_attempt_at) AS turn
        FROM key_head
        WHERE status = '{QUEUED.value}' AND next_attempt_at <= %(now)s
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
        SELECT j.id, j.partition_at, j.consumer_id, j.status FROM {_JOB} j
        WHERE j.id = candidate.id AND j.partition_at = candidate.partition_at
        LIMIT 1
        FOR UPDATE OF j SKIP LOCKED
    ) j
    WHERE j.status = '{QUEUED.value}'
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
    UPDATE {_CONSUMER} c
    SET next_slot_at = paced.first_slot + make_interval(secs => used.slots / paced.per_second)
    FROM paced JOIN (
        SELECT consumer_id, count(*) AS slots FROM taken GROUP BY consumer_id
    ) used ON used.consumer_id = paced.id
    WHERE c.id = paced.id
)
UPDATE {_JOB} j
SET status = '{INFLIGHT.value}', status_changed_at = %(now)s, attempts = j.attempts + 1,
    lease_expires_at = %(lease_until)s, claimed_by = %(dispatcher)s
FROM slotted, {_MESSAGE} m, {_CONSUMER} c
WHERE j.id = slotted.id AND j.partition_at = slotted.partition_at
    AND m.id = j.message_id AND c.id = j.consumer_id
RETURNING j.id, j.partition_at, j.attempts, j.priority, j.next_attempt_at, c.id, c.changed_at,
    j.created_at, m.public_id, m.payload, m.payload_file, m.content_type, m.priority, m.headers,
    m.traceparent, m.tracestate, m.event_type, slotted.send_at
"""  # noqa: S608

# Any answer that is not unavailability closes the circuit of its consumer (jobs/queue/circuit.py).
# The condition keeps the usual case (nothing to reset) free of writes; a row another transaction
# holds is skipped, never waited for (circuit.free_rows).
_CLOSE_CIRCUITS = f"""
    UPDATE {_CONSUMER}
    SET circuit_failures = 0, circuit_open_until = NULL, circuit_cooldown_seconds = 0
    WHERE id IN (
        SELECT id FROM {_CONSUMER}
        WHERE id = ANY(%(consumers)s::bigint[])
            AND (circuit_failures > 0 OR circuit_open_until IS NOT NULL)
        FOR NO KEY UPDATE SKIP LOCKED
    )
"""  # noqa: S608

# The common case, 2xx answers: their attempt rows and their jobs' move to DELIVERED in one
# statement, one round trip for the whole batch. Only jobs still INFLIGHT under the claim the
# result is of (the same attempt count) move: one whose lease expired and was swept, and perhaps
# taken again, meanwhile is left to the queue or its new holder (its duplicate delivery is the
# at-least-once price); its attempt is recorded all the same. A job deleted meanwhile (with its
# consumer or message) gets no attempt row: `present` locks the jobs against deletion before
# anything else touches them (a row this statement had already updated could not be locked).
# Every job goes by the whole primary key the claim returned, (id, partition_at), as in the claim
# above: by id alone each job probed every time partition's index. A job that retention carried
# forward meanwhile (possible only once its lease expired and the sweep gave it back) counts as
# gone: it gets no attempt row.
# - present looks each job up in a LATERAL subquery that holds the lock (so it cannot be
#   flattened into a join the planner may turn into a hash join over every partition, as it did
#   with 40 jobs and 3,000-row partitions): EXPLAIN ANALYZE on 13 partitions (DEFAULT
#   included), with statistics fresh or taken while no job was in flight, and in a generic plan
#   too, runs one primary-key probe per job in its own partition, every other partition "never
#   executed" (run-time pruning). tests/queue/test_whole_key_outcomes.py checks what it reads;
# - moved joins present on the whole key, and its `partition_at = ANY(...)` of the batch's
#   partitions prunes the others when the statement is planned with its values (a custom plan:
#   one partition left of 13); a generic plan cannot prune on an array parameter, and reads
#   each partition's index of in-flight jobs once, as before.
RECORD_DELIVERIES_SQL = f"""
WITH present AS MATERIALIZED (
    SELECT j.id, j.partition_at, claimed.attempts
    FROM unnest(%(jobs)s::bigint[], %(partitions)s::timestamptz[], %(attempts)s::int[])
        AS claimed(id, partition_at, attempts)
        CROSS JOIN LATERAL (
            SELECT j.id, j.partition_at FROM {_JOB} j
            WHERE j.id = claimed.id AND j.partition_at = claimed.partition_at
            FOR KEY SHARE
        ) j
),
closed AS ({_CLOSE_CIRCUITS}),
moved AS (
    UPDATE {_JOB} j
    SET status = '{DELIVERED.value}', status_changed_at = %(now)s, lease_expires_at = NULL,
        last_error = ''
    FROM present
    WHERE j.id = present.id AND j.partition_at = present.partition_at
        AND j.partition_at = ANY(%(batch_partitions)s::timestamptz[])
        AND j.attempts = present.attempts AND j.status = '{INFLIGHT.value}'
)
INSERT INTO {DeliveryAttempt._meta.db_table} (job_id, consumer_id, attempt_number, started_at,
    duration_ms, status_code, error_class, response_excerpt, dispatcher_id)
SELECT job_id, consumer_id, attempt_number, started_at, duration_ms, status_code, '', excerpt,
    %(dispatcher)s
FROM unnest(%(jobs)s::bigint[], %(job_consumers)s::bigint[], %(attempts)s::int[],
    %(started)s::timestamptz[], %(durations)s::float8[], %(statuses)s::smallint[],
    %(excerpts)s::text[])
    AS result(job_id, consumer_id, attempt_number, started_at, duration_ms, status_code, excerpt)
WHERE job_id IN (SELECT id FROM present)
"""  # noqa: S608


def claim_parameters(
    limit: int, now: datetime, rooms: ClaimRooms, dispatcher_id: str | None
) -> dict[str, Any]:
    """CLAIM_FOR_PUSH_SQL's parameters."""
    consumers = list(rooms.rooms)
    return {
        "now": now,
        "lease_until": push_lease_expiry(now),
        "limit": limit,
        "candidates": 2 * limit,
        "dispatcher": dispatcher_id,
        "room_consumers": consumers,
        "rooms": [rooms.rooms[c] for c in consumers],
        "new": [c in rooms.new for c in consumers],
        "new_room": rooms.new_room,
        "new_budget": rooms.new_budget,
    }
