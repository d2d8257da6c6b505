-- The job queue's SQL is the files of jobs/queue/sql/, each a part of the queue;
-- jobs/queue/queries.py reads them all (its docstring says how a block is written), and a
-- statement or fragment is named once across them. This file holds the fragments that statements
-- of several files share. The modules of jobs/queue run the statements by name; nothing else
-- writes queue SQL. Why the statements are shaped as they are: docs/queue-design.md.
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
-- Wakes idle dispatchers, only when one of them guards (sql/wakeup.sql, jobs/queue/wakeup.py):
-- then the shared try-lock fails and PostgreSQL delivers the NOTIFY at commit, once per
-- transaction. Else the lock is taken, shared, to the end of the transaction, and nothing is sent:
-- no dispatcher can start guarding until this transaction has ended, so none can go to sleep
-- without seeing its jobs; and the commit skips the lock that PostgreSQL makes notifying commits
-- take one at a time. A scalar subquery: its WHERE runs before its select list.
(SELECT pg_notify('{wakeup_channel}', '') WHERE NOT pg_try_advisory_xact_lock_shared({wakeup_guard}))

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
