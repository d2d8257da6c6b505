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
-- Wake idle dispatchers at commit (a replay, which makes jobs outside the fan-outs above), as
-- a publish does.
SELECT {notify}
