-- The history bench/scale.py measures the admin API against (issue 21), set-based in SQL.
--
-- Read by bench/scale.py, which runs each "-- step:" section as one statement, each batch in a
-- transaction of its own that also records it as done (so a build interrupted by a restart of
-- PostgreSQL resumes at the batch it was in). It reuses bench/ui_data.sql's functions bench_u
-- and bench_pick, its tables bench_ui_channel and bench_ui_profile (filled by bench/ui.py's
-- fill_profiles, then given this data set's dead rates, outage and backlogs by bench/scale.py),
-- and its scheduled, heartbeats and last_failures steps. Session settings:
--   bench.now       the end of the history (the build's start), a timestamptz
--   bench.messages  how many messages (each has one job per consumer of its channel: 10)
--   bench.lo/hi     the batch: message numbers (messages step) or message ids (jobs, attempts)
--   bench.retry_p   a delivered job needs another attempt with this probability (geometric),
--                   chosen by bench/scale.py so that the attempts average 2 per job
--   bench.queued_retry  share of QUEUED jobs that already failed once and wait for their retry
--
-- Everything random is a hash of a row's key (bench_u, bench_pick), so the attempts step can
-- recompute what the jobs step decided, and a rebuild makes the same history.

-- step: messages
-- Channel 0 ("orders") gets 44 % of the messages, so that its most failing consumer can hold
-- the 1,000,000 dead jobs of the requeue and purge measurements; the other 19 channels are
-- skewed (the second ~13 % of the rest, the last ~1 %). Times spread evenly over the 30 days
-- before bench.now, ids in time order as publishing makes them.
-- Sizes as webhooks have them: an order-like JSON document with 1 to 54 line items (e^(4u):
-- the median 7, ~650 bytes), and 1 % with an attachment of 16 to 64 KB that does not compress
-- (hex digests); 1.5 KB on average. All below BROKER_PAYLOAD_OFFLOAD_BYTES (256 KiB), so kept
-- in the row.
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
FROM generate_series(current_setting('bench.lo')::bigint,
                     current_setting('bench.hi')::bigint - 1) AS i
CROSS JOIN LATERAL (
    SELECT CASE WHEN bench_u(i * 7) < 0.44 THEN 0
                ELSE 1 + floor(19 * ((bench_u(i * 7) - 0.44) / 0.56) ^ 2)::int END AS channel_idx,
        current_setting('bench.now')::timestamptz - interval '30 days'
            + make_interval(secs => (i - bench_u(i * 7 + 1)) * 2592000.0
                / current_setting('bench.messages')::bigint) AS received_at,
        (ARRAY['created', 'updated', 'paid', 'cancelled', 'shipped'])[1 + mod(i, 5)] AS event_type,
        floor(exp(4 * bench_u(i * 7 + 5)))::int AS items,
        bench_u(i * 7 + 6) < 0.01 AS attached
) AS a
JOIN bench_ui_channel ch ON ch.idx = a.channel_idx
CROSS JOIN LATERAL (
    SELECT format(
        '{"id":"%s_%s","type":"%s.%s","created":"%s","data":{"customer":{"id":"cus_%s",'
        '"email":"customer%s@example.com","country":"%s"},"amount":%s,"currency":"%s",'
        '"items":[%s{"sku":"GIFT","qty":1,"price":0}],"note":"%s"%s}}',
        ch.prefix, i, ch.id, a.event_type,
        to_char(a.received_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
        mod(hashint8(i)::bigint & 2147483647, 200000), mod(hashint8(i)::bigint & 2147483647, 200000),
        (ARRAY['DE', 'US', 'GB', 'FR', 'NL'])[1 + mod(i, 5)],
        round((bench_u(i * 7 + 4) * 500)::numeric, 2), (ARRAY['EUR', 'USD', 'GBP'])[1 + mod(i, 3)],
        repeat(format('{"sku":"SKU-%s","name":"Item %s of the catalogue","qty":%s,"price":%s},',
                      mod(i, 997), mod(i, 997), 1 + mod(i, 3), 1 + mod(i, 90)), a.items - 1),
        left(md5(i::text), 8 + mod(i, 24)::int),
        CASE WHEN a.attached THEN ',"attachment":"' || (
            SELECT string_agg(md5(i || ':' || g), '')
            FROM generate_series(1, 500 + mod(i, 1500)) AS g) || '"'
        ELSE '' END
    ) AS text
) AS body
ORDER BY i;

-- step: jobs
-- One job per consumer of the message's channel. A consumer's jobs newer than its backlog_since
-- are QUEUED (it lags behind: every consumer does, by hours to days, so that 4 % of all jobs
-- wait), most untried, a share after one failed attempt and due for their retry. Older jobs are
-- DEAD when they fall in the consumer's outage or draw below its dead rate (after the
-- consumer's last attempt, after the first for a non-retryable status); the rest DELIVERED,
-- after 1 + a geometric number of failed attempts (bench.retry_p), capped at the consumer's
-- attempts. Each job is in the time partition of its creation, as on a broker that ran for the
-- month (the build makes the time partitions first).
INSERT INTO jobs_job (message_id, consumer_id, status, priority, ordering_key, attempts,
    next_attempt_at, lease_expires_at, incremental_timeout, last_error, created_at,
    status_changed_at, enqueued_at, partition_at)
SELECT m.id, p.consumer_id, s.status, m.priority, m.ordering_key, s.made,
    m.received_at + make_interval(secs => CASE
        WHEN s.status = 'QUEUED' THEN p.offsets[s.made + 1] ELSE p.offsets[s.made] END),
    NULL, 0,
    CASE WHEN s.status = 'DEAD' AND p.non_retryable THEN 'HTTP ' || e.code || ' is not retryable'
         WHEN s.status = 'DEAD' THEN e.error || '; all ' || s.made || ' attempts used'
         WHEN s.status = 'QUEUED' AND s.made > 0 THEN e.error
         ELSE '' END,
    m.received_at,
    m.received_at + make_interval(secs => CASE
        WHEN s.made > 0 THEN p.offsets[s.made] + 0.2 ELSE 0 END),
    m.received_at, m.received_at
FROM broker_message m
JOIN bench_ui_profile p ON p.channel_id = m.channel_id
CROSS JOIN LATERAL (
    SELECT m.id * 256 + p.idx AS k,
        CASE WHEN m.received_at >= p.backlog_since THEN 'QUEUED'
             WHEN coalesce(m.received_at >= p.down_from AND m.received_at < p.down_to, false)
                OR bench_u(m.id * 256 + p.idx) < p.dead_rate THEN 'DEAD'
             ELSE 'DELIVERED' END AS status
) AS a
CROSS JOIN LATERAL (
    SELECT a.status, CASE a.status
        WHEN 'QUEUED' THEN (bench_u(a.k * 3 + 2) < current_setting('bench.queued_retry')::float8)::int
        WHEN 'DEAD' THEN CASE WHEN p.non_retryable THEN 1 ELSE p.max_attempts END
        ELSE least(p.max_attempts, 1 + floor(ln(1 - bench_u(a.k * 3 + 1))
                                             / ln(current_setting('bench.retry_p')::float8))::int)
        END AS made
) AS s
CROSS JOIN LATERAL (
    SELECT c.code,
        CASE c.code
            WHEN 0 THEN 'Operation timed out after 10000 milliseconds with 0 bytes received'
            WHEN 1 THEN 'Failed to connect to ' || p.host || ' port 443 after 2 ms: Couldn''t connect to server'
            ELSE 'HTTP ' || c.code END AS error
    FROM (SELECT CASE WHEN s.status = 'DEAD' THEN bench_pick(p.fail_codes, a.k * 16 + s.made)
                      ELSE bench_pick('{503,0,502}', a.k * 16 + s.made) END AS code) AS c
) AS e
WHERE m.status = 'DISPATCHED'
    AND m.id >= current_setting('bench.lo')::bigint AND m.id < current_setting('bench.hi')::bigint;

-- step: attempts
-- Every recorded attempt of the jobs of the batch, at the consumer's retry offsets: a
-- delivered job's last one answered 200, every other failed with the consumer's failure codes
-- (a dead job) or a passing 503, timeout or 502.
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
CROSS JOIN LATERAL (SELECT j.message_id * 256 + p.idx AS k) AS a
CROSS JOIN LATERAL generate_series(1, j.attempts) AS n
CROSS JOIN LATERAL (
    SELECT CASE WHEN j.status = 'DELIVERED' AND n = j.attempts THEN 200
                WHEN j.status = 'DEAD' THEN bench_pick(p.fail_codes, a.k * 16 + n)
                ELSE bench_pick('{503,0,502}', a.k * 16 + n) END AS code
) AS c
WHERE j.message_id >= current_setting('bench.lo')::bigint
    AND j.message_id < current_setting('bench.hi')::bigint;
