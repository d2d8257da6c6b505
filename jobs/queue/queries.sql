-- Every statement of the job queue, by name (jobs/queue/queries.py reads this file; its docstring
-- says how a block is written). The modules of jobs/queue run them by name; nothing else writes
-- queue SQL. Why the statements are shaped as they are: docs/queue-design.md.
--
-- Code constants are literals (job and message states, consumer types), so that PostgreSQL
-- matches the partial indexes even with a generic plan; every value is a parameter. The tables
-- are those of the models: jobs_job (Job), jobs_deliveryattempt (DeliveryAttempt),
-- jobs_dispatcherheartbeat, consumers_consumer (Consumer), broker_message (Message),
-- broker_channel, broker_producer and its allowed_channels table.

------------------------------------------------------------------------------------------------
-- The rules the statements share (jobs/queue/rules.py names them in Python)
------------------------------------------------------------------------------------------------

-- fragment: job_columns
-- The columns of a new job that a fan-out statement inserts; the values follow each statement's
-- own source (a published message, a released one, a replay).
(message_id, consumer_id, status, priority, ordering_key, attempts,
    next_attempt_at, incremental_timeout, last_error, created_at, status_changed_at, enqueued_at)

-- fragment: notify
-- Wakes idle dispatchers: PostgreSQL delivers it at commit, once per transaction.
pg_notify('{wakeup_channel}', '')

-- fragment: matching_patterns(event_type)
-- The text[] of every pattern that matches a message whose type is the SQL expression
-- `event_type`: `*`, the type itself, and each of its prefixes followed by `*` (`o*`, `or*`,
-- ..., `order.created*`); `*` alone for an untyped message (NULL), which needs no subquery (most
-- messages, on a channel without event types). Computed once per message, so that matching a
-- consumer is one C operator over its patterns (`subscribed`), not a subquery per consumer.
(CASE WHEN {event_type} IS NULL THEN ARRAY['*'] ELSE (SELECT ARRAY['*', {event_type}] || array_agg(left({event_type}, n) || '*')
        FROM generate_series(1, length({event_type})) AS n) END)

-- fragment: subscribed(consumer, matching)
-- Whether the consumer row `consumer` receives a message whose `matching_patterns` is the SQL
-- expression `matching` (broker/event_types.py): it has no patterns, or one of them is among
-- those (jsonb's `?|`).
({consumer}.event_types = '[]'::jsonb OR {consumer}.event_types ?| {matching})

-- fragment: producer_may_publish(producer, channel)
-- rules.producer_may_publish for the SQL expressions `producer` and `channel` (IDs): true when
-- the statement's parameter `producers_bound` is false (rules.producer_rule_parameters), else
-- one probe of the join table's unique (producer, channel) index.
(NOT %(producers_bound)s OR EXISTS (
        SELECT 1 FROM broker_producer_allowed_channels allowed
        WHERE allowed.producer_id = {producer} AND allowed.channel_id = {channel}))

-- fragment: horizon
-- How far ahead a claim books a rate-limited consumer's slots (rules.SLOT_HORIZON_SECONDS).
interval '{slot_horizon_seconds} seconds'

-- fragment: head_of_key
-- An ordered consumer is handed only the head of each ordering key, so that a key's messages go
-- one at a time, in order: the job with no pending job of the same consumer and key with a lower
-- id (the pull claim's form; the push claim walks the keys instead, claim_for_push).
AND NOT EXISTS (
        SELECT FROM jobs_job earlier
        WHERE earlier.consumer_id = j.consumer_id AND earlier.ordering_key = j.ordering_key
            AND earlier.status IN {pending}
            AND earlier.id < j.id
    )

------------------------------------------------------------------------------------------------
-- Publishing: messages and their jobs
------------------------------------------------------------------------------------------------

-- name: insert_message
-- Publish: the message and one job per subscribed consumer of the channel in one statement:
-- atomic by itself, one round trip (a broadcast went from 8 round trips to 1 with it), and the
-- consumers are read in the same snapshot as the insert. The channel and producer are checked in
-- it too, and, for a broadcast, their tokens: the digests of the tokens given must equal the
-- stored ones (an ordinary comparison, not a constant-time one, is safe here: it compares digests
-- of what the caller sent, and learning how many leading characters of such a digest match the
-- stored one tells nothing about a token, as SHA-256 cannot be steered towards a prefix); so is
-- whether the producer may publish to the channel. `checked` says which of the two refused the
-- message (coalesce: a token not given compares as null).
WITH channel AS (
    SELECT id, token_hash FROM broker_channel WHERE id = %(channel)s
), producer AS (
    SELECT id, token_hash FROM broker_producer WHERE id = %(producer)s
), checked AS (
    SELECT channel.id AS channel_id, producer.id AS producer_id,
        NOT %(check_tokens)s OR coalesce(channel.token_hash = %(channel_token)s
            AND producer.token_hash = %(producer_token)s, false) AS tokens_matched,
        {producer_may_publish(producer.id, channel.id)} AS allowed
    FROM channel, producer
), subscription AS (
    SELECT {matching_patterns(%(event_type)s::text)} AS patterns
), consumers AS (
    SELECT consumer.id FROM consumers_consumer consumer JOIN channel ON consumer.channel_id = channel.id
    CROSS JOIN subscription WHERE {subscribed(consumer, subscription.patterns)}
), message AS (
    INSERT INTO broker_message (channel_id, producer_id, public_id, payload,
        payload_file, payload_size, content_type, priority, headers, ordering_key, event_type,
        status, received_at, dispatched_at, traceparent, tracestate)
    SELECT checked.channel_id, checked.producer_id, %(public_id)s, %(payload)s,
        %(payload_file)s, %(payload_size)s, %(content_type)s, %(priority)s, %(headers)s::jsonb,
        %(ordering_key)s, %(event_type)s,
        CASE WHEN EXISTS (SELECT FROM consumers) THEN 'DISPATCHED' ELSE 'ACKNOWLEDGED' END,
        %(now)s, CASE WHEN EXISTS (SELECT FROM consumers) THEN %(now)s::timestamptz END,
        %(traceparent)s, %(tracestate)s
    FROM checked
    WHERE checked.tokens_matched AND checked.allowed
    RETURNING id, status, dispatched_at
), jobs AS (
    INSERT INTO jobs_job {job_columns}
    SELECT message.id, consumers.id, 'QUEUED', %(priority)s, %(ordering_key)s, 0,
        %(now)s, 0, '', %(now)s, %(now)s, %(now)s
    FROM message, consumers
)
SELECT message.id, message.status, message.dispatched_at,
    EXISTS (SELECT FROM channel), EXISTS (SELECT FROM producer),
    (SELECT tokens_matched FROM checked), (SELECT allowed FROM checked),
    (SELECT {notify} FROM message WHERE EXISTS (SELECT FROM consumers))
FROM (SELECT) AS one_row LEFT JOIN message ON true

-- name: insert_messages
-- The batch publish (`publish_many`; why one statement: docs/performance-history.md, "Batch
-- ingest (issue 18)"): the channel and producer checked, and that the producer may publish to the
-- channel, every message inserted in the batch's order (so message IDs, and the job IDs made from
-- them, follow it: an ordered consumer gets a key's messages in that order), one QUEUED job per
-- subscribed consumer for each unscheduled message, and dispatchers woken once, at commit. The
-- consumers are read once, in the snapshot of the inserts. A duplicate ID fails the whole
-- statement (IntegrityError): nothing is inserted. The batch is one JSON array parameter
-- (jobs/queue/postgres_batch.py).
WITH channel AS (
    SELECT id FROM broker_channel WHERE id = %(channel)s
), producer AS (
    SELECT known.id, {producer_may_publish(known.id, %(channel)s)} AS allowed
    FROM broker_producer known WHERE known.id = %(producer)s
), consumers AS MATERIALIZED (
    SELECT consumer.id, consumer.event_types FROM consumers_consumer consumer
    JOIN channel ON consumer.channel_id = channel.id
), item AS (
    -- One JSON array per message, its fields in the order of batch_parameters.
    SELECT e->>0 AS public_id, decode(e->>1, 'hex') AS payload, e->>2 AS payload_file,
        (e->>3)::int AS payload_size, e->>4 AS content_type, (e->>5)::int AS priority,
        e->6 AS headers, e->>7 AS ordering_key, (e->>8)::timestamptz AS scheduled_for,
        e->>9 AS traceparent, e->>10 AS tracestate, e->>11 AS event_type,
        {matching_patterns(e->>11)} AS patterns, position
    FROM jsonb_array_elements(%(messages)s::jsonb) WITH ORDINALITY AS message_row(e, position)
), message AS (
    INSERT INTO broker_message (channel_id, producer_id, public_id, payload, payload_file,
        payload_size, content_type, priority, headers, ordering_key, event_type, status,
        received_at, dispatched_at, scheduled_for, traceparent, tracestate)
    SELECT channel.id, producer.id, item.public_id, item.payload, item.payload_file,
        item.payload_size, item.content_type, item.priority, item.headers,
        item.ordering_key, item.event_type,
        CASE WHEN item.scheduled_for IS NOT NULL THEN 'SCHEDULED'
            WHEN item.subscribed THEN 'DISPATCHED'
            ELSE 'ACKNOWLEDGED' END,
        %(now)s,
        CASE WHEN item.scheduled_for IS NULL AND item.subscribed THEN %(now)s::timestamptz END,
        item.scheduled_for, item.traceparent, item.tracestate
    FROM (
        SELECT item.*, EXISTS (
            SELECT FROM consumers WHERE {subscribed(consumers, item.patterns)}
        ) AS subscribed
        FROM item
    ) AS item, channel, producer
    WHERE producer.allowed
    ORDER BY item.position
    RETURNING id, public_id, priority, ordering_key, scheduled_for
), jobs AS (
    INSERT INTO jobs_job {job_columns}
    SELECT message.id, consumers.id, 'QUEUED', message.priority, message.ordering_key, 0,
        %(now)s, 0, '', %(now)s, %(now)s, %(now)s
    FROM message JOIN item ON item.public_id = message.public_id
    JOIN consumers ON {subscribed(consumers, item.patterns)}
    WHERE message.scheduled_for IS NULL
    ORDER BY message.id, consumers.id
    RETURNING message_id
)
SELECT EXISTS (SELECT FROM channel), EXISTS (SELECT FROM producer), inserted.public_ids,
    inserted.keys, (SELECT allowed FROM producer), (SELECT {notify} WHERE EXISTS (SELECT FROM jobs))
FROM (SELECT array_agg(public_id) AS public_ids, array_agg(id) AS keys FROM message) AS inserted

-- name: add_jobs
-- Replay's new jobs (broker/replay.py): one for each of the consumers given, in their order, for
-- a message published before they joined its channel. Job IDs follow that order, as in the
-- fan-outs above.
INSERT INTO jobs_job {job_columns}
SELECT %(message)s, consumer.id, 'QUEUED', %(priority)s, %(ordering_key)s, 0, %(now)s, 0,
    '', %(now)s, %(now)s, %(now)s
FROM unnest(%(consumers)s::bigint[]) WITH ORDINALITY AS consumer(id, position)
ORDER BY consumer.position

-- name: release_due_messages
-- Release of due scheduled messages: locks them (skipping those another caller holds; the status
-- test is re-checked on the locked row version, so a message released meanwhile is not taken
-- again), inserts their jobs for the consumers subscribed then, then marks them released; the
-- consumers are read in the same snapshot by both. Jobs are inserted in due order: job IDs define
-- the order in which ordered consumers receive a key's messages, so a scheduled message takes its
-- place in that order at its release. `AS MATERIALIZED` with the LIMIT: docs/queue-design.md
-- (PostgreSQL bug #15715).
WITH due AS MATERIALIZED (
    SELECT id, channel_id, priority, ordering_key, scheduled_for,
        {matching_patterns(event_type)} AS patterns
    FROM broker_message
    WHERE status = 'SCHEDULED' AND scheduled_for <= %(now)s
    ORDER BY scheduled_for, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), jobs AS (
    INSERT INTO jobs_job {job_columns}
    SELECT due.id, consumer.id, 'QUEUED', due.priority, due.ordering_key, 0, %(now)s, 0,
        '', %(now)s, %(now)s, %(now)s
    FROM due JOIN consumers_consumer consumer ON consumer.channel_id = due.channel_id
        AND {subscribed(consumer, due.patterns)}
    ORDER BY due.scheduled_for, due.id, consumer.id
    RETURNING message_id
), released AS (
    UPDATE broker_message message
    SET status = CASE WHEN has_consumers THEN 'DISPATCHED' ELSE 'ACKNOWLEDGED' END,
        dispatched_at = CASE WHEN has_consumers THEN %(now)s::timestamptz END
    FROM (
        SELECT due.id, EXISTS (
            SELECT FROM consumers_consumer consumer WHERE consumer.channel_id = due.channel_id
                AND {subscribed(consumer, due.patterns)}
        ) AS has_consumers
        FROM due
    ) AS target
    WHERE message.id = target.id
    RETURNING message.id
)
SELECT (SELECT count(*) FROM released), (SELECT {notify} WHERE EXISTS (SELECT FROM jobs))

-- name: wake_dispatchers
-- Wake idle dispatchers at commit (a replay, which makes jobs outside the fan-outs above).
SELECT {notify}

------------------------------------------------------------------------------------------------
-- Push: the dispatchers' claim and their outcomes
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
                AND j.next_attempt_at <= %(now)s
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
                WHERE f.consumer_id = cap.id AND f.status = 'INFLIGHT'
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
             FROM jobs_job j
             WHERE j.consumer_id = room.id AND j.status IN {pending}
             ORDER BY j.ordering_key, j.id LIMIT 1)
            UNION ALL
            SELECT next_key.*
            FROM key_head CROSS JOIN LATERAL (
                SELECT j.ordering_key, j.id, j.partition_at, j.status, j.priority,
                    j.next_attempt_at
                FROM jobs_job j
                WHERE j.consumer_id = room.id AND j.status IN {pending}
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
WHERE j.id = slotted.id AND j.partition_at = slotted.partition_at
    AND m.id = j.message_id AND c.id = j.consumer_id
RETURNING j.id, j.partition_at, j.attempts, j.priority, j.next_attempt_at, c.id, c.changed_at,
    j.created_at, m.public_id, m.payload, m.payload_file, m.content_type, m.priority, m.headers,
    m.traceparent, m.tracestate, m.event_type, slotted.send_at

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

------------------------------------------------------------------------------------------------
-- The circuit breaker (jobs/queue/circuit.py owns the rule; docs/delivery.md, "Circuit
-- breaker"): which consumers may receive and their cap are fragments of the claim above
-- (`receiving`, `in_flight_cap`); the counting, opening and closing are `consumer_outcomes`.
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

------------------------------------------------------------------------------------------------
-- Pull consumers: a claim in one statement, an acknowledgement in one, a report's read and its
-- moves in one each. Pull workers ask over HTTP for batches of 50 to 500 jobs; what costs there
-- is the interpreter's work per job, so the statements return only what the answer and the log
-- lines need (docs/performance-history.md, "Pull: batch acknowledgement (issue 18)").
------------------------------------------------------------------------------------------------

-- fragment: pull_claim(head_of_key)
-- The pull claim: the consumer's best due jobs, locked (skipping those another worker is
-- taking), moved to INFLIGHT under the lease with one attempt more, and returned with their
-- messages (queries.CLAIMED_JOB_FIELDS, CLAIMED_MESSAGE_FIELDS). MATERIALIZED with the LIMIT:
-- docs/queue-design.md (PostgreSQL bug #15715). Rows are matched on the whole primary key,
-- (id, partition_at), as in the push claim.
WITH due AS MATERIALIZED (
    SELECT j.id, j.partition_at
    FROM jobs_job j
    WHERE j.consumer_id = %(consumer)s AND j.status = 'QUEUED'
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
{pull_claim()}

-- name: claim_heads_for_pull
-- The claim of an ordered consumer: only the head of each ordering key.
{pull_claim({head_of_key})}

-- name: acknowledge_pull_job
-- A pull consumer's report on one job it holds (DELIVERED or DEAD): the move and what its log
-- line says of the job before it (`held`, read in the statement's snapshot) in one round trip;
-- nothing when the job is not the consumer's or not INFLIGHT (the caller then looks into why).
WITH held AS (
    SELECT job.id, job.attempts, job.status_changed_at, message.public_id, message.channel_id,
        message.traceparent, message.tracestate
    FROM jobs_job job JOIN broker_message message ON message.id = job.message_id
    WHERE job.id = %(job)s AND job.consumer_id = %(consumer)s
        AND job.created_at >= %(created_from)s AND job.created_at < %(created_until)s
)
UPDATE jobs_job job
SET status = %(target)s, status_changed_at = %(now)s, lease_expires_at = NULL,
    last_error = %(reason)s
FROM held
WHERE job.id = held.id AND job.status = 'INFLIGHT'
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
-- error and (QUEUED) due time; jobs no longer INFLIGHT are left alone and not counted.
UPDATE jobs_job job
SET status = move.target, status_changed_at = %(now)s, lease_expires_at = NULL,
    last_error = move.reason, next_attempt_at = coalesce(move.due_at, job.next_attempt_at)
FROM unnest(%(keys)s::bigint[], %(targets)s::text[], %(reasons)s::text[],
    %(due)s::timestamptz[]) AS move(id, target, reason, due_at)
WHERE job.id = move.id AND job.status = 'INFLIGHT'

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

-- name: count_dead_range
-- How many jobs a range of one consumer's dead-letter queue holds now (an index range of
-- job_consumer_dead_idx).
SELECT count(*) FROM jobs_job
WHERE consumer_id = %(consumer)s AND status = 'DEAD'
    AND status_changed_at >= %(since)s AND status_changed_at < %(before)s
