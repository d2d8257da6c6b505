"""The queue on PostgreSQL: each hot operation one statement and one round trip.

Every statement of the queue that is written in SQL lives here, but for the pull consumers' own
in jobs/queue/postgres_pull.py (procrastinate keeps its queries in one file the same way); the
rules they apply are those of jobs/queue/rules.py, and jobs/queue/portable.py does the same
through the ORM. Table names come from model metadata and code constants are literals (so that
PostgreSQL matches the partial indexes even with a generic plan); every value is a parameter. Why
the statements are shaped as they are: docs/queue-design.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from broker.models import Channel, Message, Producer
from consumers.models import Consumer
from jobs.delivery import AttemptResult
from jobs.models import DeliveryAttempt, Job
from jobs.queue.dispatchers import reclaim_from_dead_dispatchers, session_name
from jobs.queue.postgres_batch import batch_parameters, insert_batch_sql, inserted_batch
from jobs.queue.postgres_pull import PostgresPullStatements
from jobs.queue.rules import (
    DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER,
    SLOT_HORIZON_SECONDS,
    WAKEUP_CHANNEL,
    matching_patterns_sql,
    producer_may_publish_sql,
    producer_rule_parameters,
    push_lease_expiry,
    subscribed_sql,
)
from jobs.queue.types import (
    ClaimedJob,
    ClaimRooms,
    Inserted,
    InsertedBatch,
    MessageBatch,
    TokenDigests,
)
from jobs.queue.wakeup import listen_for_jobs
from jobs.states import DELIVERED, INFLIGHT, QUEUED

_JOB = Job._meta.db_table
_MESSAGE = Message._meta.db_table
_CONSUMER = Consumer._meta.db_table
_DISPATCHED, _ACKNOWLEDGED = Message.Status.DISPATCHED.value, Message.Status.ACKNOWLEDGED.value
_SCHEDULED = Message.Status.SCHEDULED.value

# The columns of a new job that a fan-out statement inserts; the values follow each statement's
# own source (a published message, or a released one).
_JOB_COLUMNS = """(message_id, consumer_id, status, priority, ordering_key, attempts,
    next_attempt_at, incremental_timeout, last_error, created_at, status_changed_at, enqueued_at)"""
# Wakes idle dispatchers: PostgreSQL delivers it at commit, once per transaction.
_NOTIFY = f"pg_notify('{WAKEUP_CHANNEL}', '')"

# Publish: the message and one job per subscribed consumer of the channel (rules.subscribed_sql)
# in one statement: atomic by
# itself, one round trip (a broadcast went from 8 round trips to 1 with it), and the consumers
# are read in the same snapshot as the insert. The channel and producer are checked in it too,
# and, for a broadcast, their tokens: the digests of the tokens given must equal the stored ones
# (an ordinary comparison, not a constant-time one, is safe here: it compares digests of what the
# caller sent, and learning how many leading characters of such a digest match the stored one
# tells nothing about a token, as SHA-256 cannot be steered towards a prefix); so is whether the
# producer may publish to the channel (rules.producer_may_publish_sql). `checked` says which of
# the two refused the message (coalesce: a token not given compares as null).
INSERT_MESSAGE_SQL = f"""
WITH channel AS (
    SELECT id, token_hash FROM {Channel._meta.db_table} WHERE id = %(channel)s
), producer AS (
    SELECT id, token_hash FROM {Producer._meta.db_table} WHERE id = %(producer)s
), checked AS (
    SELECT channel.id AS channel_id, producer.id AS producer_id,
        NOT %(check_tokens)s OR coalesce(channel.token_hash = %(channel_token)s
            AND producer.token_hash = %(producer_token)s, false) AS tokens_matched,
        {producer_may_publish_sql("producer.id", "channel.id")} AS allowed
    FROM channel, producer
), subscription AS (
    SELECT {matching_patterns_sql("%(event_type)s::text")} AS patterns
), consumers AS (
    SELECT consumer.id FROM {_CONSUMER} consumer JOIN channel ON consumer.channel_id = channel.id
    CROSS JOIN subscription WHERE {subscribed_sql("consumer", "subscription.patterns")}
), message AS (
    INSERT INTO {_MESSAGE} (channel_id, producer_id, public_id, payload,
        payload_file, payload_size, content_type, priority, headers, ordering_key, event_type,
        status, received_at, dispatched_at, traceparent, tracestate)
    SELECT checked.channel_id, checked.producer_id, %(public_id)s, %(payload)s,
        %(payload_file)s, %(payload_size)s, %(content_type)s, %(priority)s, %(headers)s::jsonb,
        %(ordering_key)s, %(event_type)s,
        CASE WHEN EXISTS (SELECT FROM consumers) THEN '{_DISPATCHED}' ELSE '{_ACKNOWLEDGED}' END,
        %(now)s, CASE WHEN EXISTS (SELECT FROM consumers) THEN %(now)s::timestamptz END,
        %(traceparent)s, %(tracestate)s
    FROM checked
    WHERE checked.tokens_matched AND checked.allowed
    RETURNING id, status, dispatched_at
), jobs AS (
    INSERT INTO {_JOB} {_JOB_COLUMNS}
    SELECT message.id, consumers.id, '{QUEUED.value}', %(priority)s, %(ordering_key)s, 0,
        %(now)s, 0, '', %(now)s, %(now)s, %(now)s
    FROM message, consumers
)
SELECT message.id, message.status, message.dispatched_at,
    EXISTS (SELECT FROM channel), EXISTS (SELECT FROM producer),
    (SELECT tokens_matched FROM checked), (SELECT allowed FROM checked),
    (SELECT {_NOTIFY} FROM message WHERE EXISTS (SELECT FROM consumers))
FROM (SELECT) AS one_row LEFT JOIN message ON true
"""  # noqa: S608

# Publish many at once: jobs/queue/postgres_batch.py (the batch broadcast, `publish_many`).
INSERT_BATCH_SQL = insert_batch_sql(_JOB_COLUMNS, _NOTIFY)

# Release of due scheduled messages: locks them (skipping those another caller holds; the status
# test is re-checked on the locked row version, so a message released meanwhile is not taken
# again), inserts their jobs for the consumers subscribed then (rules.subscribed_sql), then marks
# them released; the consumers are read in the same snapshot by both. Jobs are inserted in due
# order: job IDs define the order in which ordered consumers receive a key's messages, so a
# scheduled message takes its place in that order at its release. `AS MATERIALIZED` with the
# LIMIT: docs/queue-design.md (PostgreSQL bug #15715).
RELEASE_DUE_SQL = f"""
WITH due AS MATERIALIZED (
    SELECT id, channel_id, priority, ordering_key, scheduled_for,
        {matching_patterns_sql("event_type")} AS patterns
    FROM {_MESSAGE}
    WHERE status = '{_SCHEDULED}' AND scheduled_for <= %(now)s
    ORDER BY scheduled_for, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), jobs AS (
    INSERT INTO {_JOB} {_JOB_COLUMNS}
    SELECT due.id, consumer.id, '{QUEUED.value}', due.priority, due.ordering_key, 0, %(now)s, 0,
        '', %(now)s, %(now)s, %(now)s
    FROM due JOIN {_CONSUMER} consumer ON consumer.channel_id = due.channel_id
        AND {subscribed_sql("consumer", "due.patterns")}
    ORDER BY due.scheduled_for, due.id, consumer.id
    RETURNING message_id
), released AS (
    UPDATE {_MESSAGE} message
    SET status = CASE WHEN has_consumers THEN '{_DISPATCHED}' ELSE '{_ACKNOWLEDGED}' END,
        dispatched_at = CASE WHEN has_consumers THEN %(now)s::timestamptz END
    FROM (
        SELECT due.id, EXISTS (
            SELECT FROM {_CONSUMER} consumer WHERE consumer.channel_id = due.channel_id
                AND {subscribed_sql("consumer", "due.patterns")}
        ) AS has_consumers
        FROM due
    ) AS target
    WHERE message.id = target.id
    RETURNING message.id
)
SELECT (SELECT count(*) FROM released), (SELECT {_NOTIFY} WHERE EXISTS (SELECT FROM jobs))
"""  # noqa: S608

# The push claim:
# - paced: the rate-limited consumers (rules.bookable_slots) that may receive, have a job due and
#   a slot free within the horizon. Their rows are locked, so that claims of several dispatchers
#   book one consumer's slots one after another; a row another transaction holds is skipped (its
#   consumer gets nothing from this claim, and no claim ever waits). A row locked is read as the
#   last commit left it (PostgreSQL re-reads it), so a claim books after the one before, and
#   skips the consumer if no slot is free any more. FOR NO KEY UPDATE leaves publishers'
#   foreign-key checks unblocked. A consumer booked up to the horizon, the usual case between two
#   of its slots, is not locked at all;
# - cap, room: each consumer's free in-flight slots, for push consumers that may receive
#   (rules.receiving_push_consumers, rules.in_flight_cap), and for a paced one no more than its
#   bookable slots. Counted once per claim (hence
#   MATERIALIZED), and only up to the cap: a plain index scan that stops there, and that marks
#   the dead index entries of finished jobs as it passes, so that the next claim skips them;
# - due: per consumer, its best due jobs up to its room, read from an index without locks. For an
#   ordered consumer only the head of each key qualifies (rules.heads_of_their_keys): the key's
#   pending job with the lowest id, when it is QUEUED and due. The heads are found by walking
#   the consumer's keys through job_consumer_key_pending_idx, one index probe per key, so the
#   cost grows with the number of keys with pending jobs, not with the backlog behind them;
# - candidate: the best of those overall. Twice the batch is read, so that rows a concurrent
#   dispatcher holds can be skipped without coming back short;
# - taken: those rows locked, skipping any already locked, up to the batch size. Found by the whole
#   primary key, (id, partition_at): by id alone the planner, misled by the statistics of a young
#   partition (taken while no job waited), walked a partial index for each candidate and the
#   empty-table drain fell from about 2,600 to 600 jobs/s (docs/performance.md);
# - slotted: a paced consumer's jobs get its next slots in their order (rules.slot_times), and
#   booked moves its next free slot past them: only the jobs taken use slots;
# - the UPDATE moves them to INFLIGHT with a lease, counts the attempt and returns the columns of
#   types.CLAIM_COLUMNS and the send time.
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
    FROM {_JOB} j
        JOIN candidate ON candidate.id = j.id AND candidate.partition_at = j.partition_at
    WHERE j.status = '{QUEUED.value}'
    ORDER BY candidate.priority DESC, candidate.turn, candidate.next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
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
    AND j.status = '{QUEUED.value}' AND m.id = j.message_id AND c.id = j.consumer_id
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


class PostgresQueue(PostgresPullStatements):
    """jobs/queue's operations that PostgreSQL does in one statement each."""

    # Recording outcomes may run on a connection of its own beside the claims.
    concurrent_writers = True

    async def listen(self, wake: Callable[[], None], dispatcher_id: str) -> None:
        await listen_for_jobs(wake, session_name(dispatcher_id))

    def reclaim_from_dead_dispatchers(self, dispatcher_id: str, now: datetime) -> int:
        return reclaim_from_dead_dispatchers(dispatcher_id, now)

    def insert_message(self, message: Message, tokens: TokenDigests | None = None) -> Inserted:
        # Alone, the statement commits by itself; inside a caller's transaction it needs a
        # savepoint so that a refused message (duplicate ID) leaves that transaction usable.
        savepoint = transaction.atomic() if connection.in_atomic_block else nullcontext()
        parameters = _message_parameters(message) | _check_parameters(tokens)
        with savepoint, connection.cursor() as cursor:
            cursor.execute(INSERT_MESSAGE_SQL, parameters)
            row = cursor.fetchone()
        message.pk, message.status, message.dispatched_at = row[:3]
        message._state.adding = message.pk is None
        return Inserted.from_checks(*row[3:7])

    def insert_messages(self, batch: MessageBatch) -> InsertedBatch:
        # As insert_message: a savepoint only inside a caller's transaction.
        savepoint = transaction.atomic() if connection.in_atomic_block else nullcontext()
        with savepoint, connection.cursor() as cursor:
            cursor.execute(INSERT_BATCH_SQL, batch_parameters(batch))
            return inserted_batch(batch, cursor.fetchone())

    def release_due_messages(self, now: datetime, limit: int) -> int:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(RELEASE_DUE_SQL, {"now": now, "limit": limit})
            released, _ = cursor.fetchone()
        return int(released)

    def claim_for_push(
        self, limit: int, now: datetime, rooms: ClaimRooms, dispatcher_id: str | None
    ) -> list[ClaimedJob]:
        consumers = list(rooms.rooms)
        parameters: dict[str, Any] = {
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
        with connection.cursor() as cursor:
            cursor.execute(CLAIM_FOR_PUSH_SQL, parameters)
            rows = cursor.fetchall()
        return [ClaimedJob.from_row(row) for row in rows]

    def record_deliveries(
        self, results: list[AttemptResult], dispatcher_id: str, now: datetime
    ) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                RECORD_DELIVERIES_SQL,
                {
                    "dispatcher": dispatcher_id,
                    "jobs": [r.job_id for r in results],
                    "partitions": [r.partition_at for r in results],
                    "batch_partitions": sorted({r.partition_at for r in results}),
                    "job_consumers": [r.consumer_id for r in results],
                    "consumers": list({r.consumer_id for r in results}),
                    "attempts": [r.attempt for r in results],
                    "started": [r.started_at for r in results],
                    "durations": [r.duration_ms for r in results],
                    "statuses": [r.status_code for r in results],
                    "excerpts": [r.response_excerpt for r in results],
                    "now": now,
                },
            )

    def wake_dispatchers(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {_NOTIFY}")


def _message_parameters(message: Message) -> dict[str, Any]:
    return {
        "channel": message.channel_id,
        "producer": message.producer_id,
        "public_id": message.public_id,
        "payload": message.payload,
        "payload_file": message.payload_file,
        "payload_size": message.payload_size,
        "content_type": message.content_type,
        "priority": message.priority,
        "headers": json.dumps(message.headers),
        "ordering_key": message.ordering_key,
        "event_type": message.event_type,
        "now": message.received_at,
        "traceparent": message.traceparent,
        "tracestate": message.tracestate,
    }


def _check_parameters(tokens: TokenDigests | None) -> dict[str, Any]:
    return {
        "check_tokens": tokens is not None,
        "channel_token": tokens.channel if tokens else None,
        "producer_token": tokens.producer if tokens else None,
        **producer_rule_parameters(),
    }
