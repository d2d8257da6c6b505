-- The history bench/ui.py measures the operator UI against, generated set-based in SQL.
--
-- Read by bench/ui.py, which runs each "-- step:" section as one statement (the jobs and
-- attempts steps once per batch of message ids, bench.lo to bench.hi). Values come from session
-- settings rather than bind parameters, so that format() and its %s stay readable here:
--   bench.now       the end of the history (the build's start), a timestamptz
--   bench.messages  how many messages (each has one job per consumer of its channel: 10)
--   bench.lo/hi     the batch of message ids of the jobs and attempts steps
-- bench_ui_channel and bench_ui_profile (the consumers' behaviour) are filled by bench/ui.py.
--
-- Everything random is a hash of a row's key (bench_u, bench_pick), so the attempts step can
-- recompute what the jobs step decided about a job, and a rebuild makes the same history.

-- step: functions
CREATE OR REPLACE FUNCTION bench_u(k bigint) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (hashint8(k)::bigint & 2147483647)::float8 / 2147483648.0::float8;

-- step: pick
CREATE OR REPLACE FUNCTION bench_pick(choices int[], k bigint) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN choices[1 + mod(hashint8(k)::bigint & 2147483647, cardinality(choices))];

-- step: messages
-- Channels are skewed (the first gets ~22 % of the messages, the last ~1 %), times spread
-- evenly over the 30 days before bench.now, ids in time order as publishing makes them.
INSERT INTO broker_message (channel_id, producer_id, public_id, payload, payload_file,
    payload_size, content_type, priority, headers, ordering_key, event_type, status,
    received_at, dispatched_at)
SELECT ch.id, ch.producer_id, ch.prefix || '_' || i, convert_to(body.text, 'UTF8'), '',
    octet_length(body.text), 'application/json',
    CASE WHEN bench_u(i * 7 + 2) < 0.01 THEN 10 ELSE 0 END,
    CASE WHEN bench_u(i * 7 + 3) < 0.3
         THEN jsonb_build_object('X-Request-Id', md5(i::text), 'X-Tenant', 'tenant-' || mod(i, 37))
         ELSE '{}'::jsonb END,
    CASE WHEN ch.ordered THEN 'cus_' || mod(hashint8(i)::bigint & 2147483647, 2000) ELSE '' END,
    a.event_type, 'DISPATCHED', a.received_at, a.received_at
FROM generate_series(1, current_setting('bench.messages')::int) AS i
CROSS JOIN LATERAL (
    SELECT floor(20 * bench_u(i * 7) ^ 2)::int AS channel_idx,
        current_setting('bench.now')::timestamptz - interval '30 days'
            + make_interval(secs => (i - bench_u(i * 7 + 1)) * 2592000.0
                / current_setting('bench.messages')::bigint) AS received_at,
        (ARRAY['created', 'updated', 'paid', 'cancelled', 'shipped'])[1 + mod(i, 5)] AS event_type
) AS a
JOIN bench_ui_channel ch ON ch.idx = a.channel_idx
CROSS JOIN LATERAL (
    SELECT format(
        '{"id":"%s_%s","type":"%s.%s","created":"%s","data":{"customer":"cus_%s",'
        '"amount":%s,"currency":"%s","items":[%s],"note":"%s"}}',
        ch.prefix, i, ch.id, a.event_type,
        to_char(a.received_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
        mod(hashint8(i)::bigint & 2147483647, 2000), round((bench_u(i * 7 + 4) * 500)::numeric, 2),
        (ARRAY['EUR', 'USD', 'GBP'])[1 + mod(i, 3)],
        repeat('{"sku":"SKU-' || mod(i, 997) || '","qty":1},', mod(i, 4)::int) || '{"sku":"GIFT","qty":1}',
        left(md5(i::text), 8 + mod(i, 24))
    ) AS text
) AS body
ORDER BY i;

-- step: jobs
-- One job per consumer of the message's channel. A job "fails" when it falls in its consumer's
-- outage or draws below its dead rate: every attempt fails and it dies after the consumer's
-- last one (after the first for a non-retryable status); otherwise it is delivered at its first
-- attempt (92 %), second or third. Attempts happen at the consumer's retry offsets: a job
-- whose next attempt is still to come is QUEUED (retrying). A paused or rate-limited consumer's recent jobs
-- wait QUEUED, untried; a few jobs of the last 90 s are INFLIGHT.
INSERT INTO jobs_job (message_id, consumer_id, status, priority, ordering_key, attempts,
    next_attempt_at, lease_expires_at, incremental_timeout, last_error, created_at,
    status_changed_at, enqueued_at)
SELECT m.id, p.consumer_id, s.status, m.priority, m.ordering_key,
    b.made + s.inflight::int,
    m.received_at + make_interval(secs => CASE
        WHEN s.status = 'QUEUED' AND NOT a.held THEN p.offsets[b.made + 1]
        ELSE p.offsets[greatest(b.made, 1)] END),
    CASE WHEN s.inflight THEN a.now_ts + interval '5 minutes' END,
    0,
    CASE WHEN b.made = 0 OR s.status NOT IN ('DEAD', 'QUEUED') THEN ''
         WHEN s.status = 'DEAD' AND p.non_retryable THEN 'HTTP ' || e.code || ' is not retryable'
         WHEN s.status = 'DEAD' THEN e.error || '; all ' || b.made || ' attempts used'
         ELSE e.error END,
    m.received_at,
    m.received_at + make_interval(secs => CASE
        WHEN b.made > 0 THEN p.offsets[b.made] + 0.2
        WHEN s.inflight THEN 0.25
        ELSE 0 END),
    m.received_at
FROM broker_message m
JOIN bench_ui_profile p ON p.channel_id = m.channel_id
CROSS JOIN LATERAL (
    SELECT m.id * 256 + p.idx AS k,
        current_setting('bench.now')::timestamptz AS now_ts,
        extract(epoch FROM current_setting('bench.now')::timestamptz - m.received_at)::float8 AS age,
        coalesce(m.received_at >= p.down_from AND m.received_at < p.down_to, false)
            OR bench_u(m.id * 256 + p.idx) < p.dead_rate AS fails,
        coalesce(m.received_at >= p.backlog_since, false) AS held
) AS a
CROSS JOIN LATERAL (
    SELECT CASE WHEN a.fails THEN CASE WHEN p.non_retryable THEN 1 ELSE p.max_attempts END
                ELSE 1 + (bench_u(a.k * 3 + 1) < 0.08)::int + (bench_u(a.k * 3 + 1) < 0.02)::int
           END AS planned,
        NOT a.held AND a.age < 90 AND bench_u(a.k * 3 + 2) < 0.3 AS inflight
) AS pl
CROSS JOIN LATERAL (
    SELECT CASE WHEN a.held OR pl.inflight THEN 0
                WHEN a.age >= p.offsets[pl.planned] THEN pl.planned
                ELSE (SELECT count(*)::int FROM unnest(p.offsets[1:pl.planned]) AS o WHERE o <= a.age)
           END AS made
) AS b
CROSS JOIN LATERAL (
    SELECT CASE WHEN a.held THEN 'QUEUED'
                WHEN pl.inflight THEN 'INFLIGHT'
                WHEN b.made < pl.planned THEN 'QUEUED'
                WHEN a.fails THEN 'DEAD'
                ELSE 'DELIVERED' END AS status,
        pl.inflight
) AS s
CROSS JOIN LATERAL (
    SELECT c.code,
        CASE c.code
            WHEN 0 THEN 'Operation timed out after 10000 milliseconds with 0 bytes received'
            WHEN 1 THEN 'Failed to connect to ' || p.host || ' port 443 after 2 ms: Couldn''t connect to server'
            ELSE 'HTTP ' || c.code END AS error
    FROM (SELECT CASE WHEN a.fails THEN bench_pick(p.fail_codes, a.k * 16 + b.made)
                      ELSE bench_pick('{503,0,502}', a.k * 16 + b.made) END AS code) AS c
) AS e
WHERE m.status = 'DISPATCHED'
    AND m.id >= current_setting('bench.lo')::bigint AND m.id < current_setting('bench.hi')::bigint;

-- step: attempts
-- Every recorded attempt of the jobs of the batch: what the jobs step decided, recomputed from
-- the same hashes (an INFLIGHT job's attempt has no answer yet, so no row).
INSERT INTO jobs_deliveryattempt (job_id, attempt_number, started_at, duration_ms, status_code,
    error_class, response_excerpt, dispatcher_id, consumer_id)
SELECT j.id, n, j.created_at + make_interval(secs => p.offsets[n]),
    CASE c.code WHEN 200 THEN 15 + 300 * bench_u(a.k * 16 + n + 7) ^ 3
                WHEN 0 THEN 10000 + 5 * bench_u(a.k * 16 + n + 7)
                WHEN 1 THEN 1 + 3 * bench_u(a.k * 16 + n + 7)
                ELSE 5 + 2000 * bench_u(a.k * 16 + n + 7) ^ 2 END,
    CASE WHEN c.code > 1 THEN c.code END,
    CASE c.code WHEN 200 THEN '' WHEN 0 THEN 'timeout' WHEN 1 THEN 'connection'
                ELSE 'http-status' END,
    CASE c.code
        WHEN 200 THEN '{"ok":true}'
        WHEN 0 THEN ''
        WHEN 1 THEN ''
        WHEN 500 THEN CASE WHEN p.name = 'clickhouse-sink'
            THEN 'Code: 210. DB::NetException: connection to clickhouse:9000 refused'
                 || ' (NETWORK_ERROR) while inserting into events.' || p.channel_id
                 || ', query_id ' || left(md5((a.k * 16 + n)::text), 16)
            ELSE '<!doctype html><title>500 Internal Server Error</title><h1>Internal Server'
                 || ' Error</h1><p>The server encountered an internal error and was unable to'
                 || ' complete your request.</p>' END
        WHEN 502 THEN '<html><head><title>502 Bad Gateway</title></head><body><center><h1>502'
                 || ' Bad Gateway</h1></center><hr><center>nginx/1.25.3</center></body></html>'
        WHEN 503 THEN '{"error":"service_unavailable","message":"upstream connect error or'
                 || ' disconnect/reset before headers. reset reason: connection failure",'
                 || '"request_id":"' || left(md5((a.k * 16 + n)::text), 16) || '"}'
        WHEN 504 THEN '<html><head><title>504 Gateway Time-out</title></head><body><center>'
                 || '<h1>504 Gateway Time-out</h1></center><hr><center>nginx/1.25.3</center>'
                 || '</body></html>'
        WHEN 429 THEN '{"error":"rate_limited","message":"You are sending too many requests.'
                 || ' Retry after 30 seconds.","retry_after":30}'
        WHEN 401 THEN '{"error":"invalid_signature","detail":"webhook-signature matches no'
                 || ' configured secret"}'
        WHEN 422 THEN '{"errors":[{"field":"customer.email","code":"invalid","message":"Enter'
                 || ' a valid email address."}],"request_id":"'
                 || left(md5((a.k * 16 + n)::text), 16) || '"}'
        ELSE 'error ' || c.code END,
    'dispatch-' || (1 + mod(a.k + n, 4)) || '@broker-worker-' || (1 + mod(a.k, 2)),
    j.consumer_id
FROM jobs_job j
JOIN bench_ui_profile p ON p.consumer_id = j.consumer_id
CROSS JOIN LATERAL (
    SELECT j.message_id * 256 + p.idx AS k,
        coalesce(j.created_at >= p.down_from AND j.created_at < p.down_to, false)
            OR bench_u(j.message_id * 256 + p.idx) < p.dead_rate AS fails
) AS a
CROSS JOIN LATERAL generate_series(1, CASE WHEN j.status = 'INFLIGHT' THEN 0 ELSE j.attempts END) AS n
CROSS JOIN LATERAL (
    SELECT CASE WHEN j.status = 'DELIVERED' AND n = j.attempts THEN 200
                WHEN a.fails THEN bench_pick(p.fail_codes, a.k * 16 + n)
                ELSE bench_pick('{503,0,502}', a.k * 16 + n) END AS code
) AS c
WHERE j.message_id >= current_setting('bench.lo')::bigint
    AND j.message_id < current_setting('bench.hi')::bigint;

-- step: scheduled
-- Scheduled messages waiting for release over the next week (the /ui/scheduled list).
INSERT INTO broker_message (channel_id, producer_id, public_id, payload, payload_file,
    payload_size, content_type, priority, headers, ordering_key, status, received_at,
    scheduled_for)
SELECT ch.id, ch.producer_id, 'reminder_' || i, convert_to('{"reminder":' || i || '}', 'UTF8'),
    '', length('{"reminder":' || i || '}'), 'application/json', 0, '{}'::jsonb, '', 'SCHEDULED',
    current_setting('bench.now')::timestamptz - interval '2 days',
    current_setting('bench.now')::timestamptz + make_interval(secs => i * 2016.0)
FROM generate_series(1, 300) AS i
JOIN bench_ui_channel ch ON ch.idx = mod(i, 20);

-- step: reports
-- What `spark_etl report` would have written (the /ui/reports page): per consumer and day or
-- hour, from the jobs; the latencies are made up, the counts are the jobs'.
INSERT INTO jobs_deliveryreport (grain, period_start, channel_id, consumer_id, messages, jobs,
    delivered, dead, success_rate, first_attempt_success_rate, mean_attempts, latency_p50_ms,
    latency_p95_ms, latency_p99_ms, top_failures)
SELECT r.grain, r.period_start, p.channel_id, p.name, r.jobs, r.jobs, r.delivered, r.dead,
    r.delivered::float8 / nullif(r.delivered + r.dead, 0),
    r.first_ok::float8 / nullif(r.delivered + r.dead, 0),
    r.attempts::float8 / r.jobs,
    80 + 200 * bench_u(p.idx * 100000 + extract(epoch FROM r.period_start)::bigint),
    900 + 4000 * bench_u(p.idx * 100000 + extract(epoch FROM r.period_start)::bigint + 1),
    3000 + 60000 * bench_u(p.idx * 100000 + extract(epoch FROM r.period_start)::bigint + 2),
    CASE WHEN r.dead = 0 THEN ''
         ELSE (CASE p.fail_codes[1] WHEN 0 THEN 'timeout' WHEN 1 THEN 'connection'
                   ELSE p.fail_codes[1]::text END) || ':' || r.dead END
FROM (
    SELECT g.grain, date_trunc(g.grain, j.created_at, 'UTC') AS period_start, j.consumer_id,
        count(*) AS jobs,
        count(*) FILTER (WHERE j.status = 'DELIVERED') AS delivered,
        count(*) FILTER (WHERE j.status = 'DEAD') AS dead,
        count(*) FILTER (WHERE j.status = 'DELIVERED' AND j.attempts = 1) AS first_ok,
        sum(j.attempts) AS attempts
    FROM jobs_job j CROSS JOIN (VALUES ('day'), ('hour')) AS g (grain)
    WHERE j.status IN ('DELIVERED', 'DEAD')
        AND j.created_at < date_trunc('hour', current_setting('bench.now')::timestamptz, 'UTC')
    GROUP BY 1, 2, 3
) AS r
JOIN bench_ui_profile p ON p.consumer_id = r.consumer_id;

-- step: heartbeats
INSERT INTO jobs_dispatcherheartbeat (dispatcher_id, hostname, pid, started_at, last_beat_at,
    in_flight, delivered, failed)
SELECT 'dispatch-' || i || '@broker-worker-' || (1 + mod(i, 2)), 'broker-worker-' || (1 + mod(i, 2)),
    4000 + i, current_setting('bench.now')::timestamptz - interval '3 days',
    current_setting('bench.now')::timestamptz, 0, 1000000 * i, 90000 * i
FROM generate_series(1, 4) AS i;

-- step: last_failures
-- Each consumer's newest failed attempt on its row (Consumer.last_failure_at, last_failure), as
-- the dispatcher's recording of failures keeps it: the error, then the head of the answer. Run
-- after the indexes (attempt_consumer_idx finds it), and only where the columns exist.
UPDATE consumers_consumer c
SET last_failure_at = f.started_at,
    last_failure = CASE WHEN f.answer = '' THEN f.error ELSE f.error || ': ' || f.answer END
FROM bench_ui_profile p
CROSS JOIN LATERAL (
    SELECT a.started_at,
        left(regexp_replace(a.response_excerpt, '\s+', ' ', 'g'), 300) AS answer,
        CASE a.error_class
            WHEN 'timeout' THEN 'Operation timed out after 10000 milliseconds with 0 bytes received'
            WHEN 'connection' THEN 'Failed to connect to ' || p.host || ' port 443 after 2 ms: Couldn''t connect to server'
            ELSE 'HTTP ' || a.status_code END AS error
    FROM jobs_deliveryattempt a
    WHERE a.consumer_id = p.consumer_id AND a.error_class <> ''
    ORDER BY a.started_at DESC
    LIMIT 1
) AS f
WHERE c.id = p.consumer_id;
