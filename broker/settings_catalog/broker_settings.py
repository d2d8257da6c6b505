"""`BrokerSettings`: the broker's own settings (`BROKER_*`: the API, delivery, retries, payloads,
encryption, retention, the gateway's signatures, the broadcast rate limit), read by code through
`broker.conf.broker_settings`."""

from __future__ import annotations

from broker.settings_catalog.kinds import Choice, Flag, Integer, Integers, Items, Number, Text
from broker.settings_catalog.setting import BROKER, GATEWAY, RATE_LIMIT, Setting, SettingGroup

GATEWAY_AUTH_MODES = ("none", "hmac")
EVENT_LOOPS = ("asyncio", "uvloop")
PRODUCER_CHANNEL_RULES = ("open", "bound")


class BrokerSettings(SettingGroup, section=BROKER):
    """The broker's own settings (names from docs/configuration.md), which code reads through
    `broker.conf.broker_settings`; each is also read from the environment variable of its name."""

    BROKER_ADMIN_TOKENS = Setting(
        Items(),
        [],
        "comma-separated bearer tokens accepted as admin on the API",
        secret=True,
    )
    BROKER_OPEN_ADMIN_API = Setting(
        Flag(), False, "webhook-broker's open admin API, for trusted networks only"
    )
    BROKER_PUBLIC_STATUS = Setting(
        Flag(),
        True,
        "`/_status` answers anyone (load balancer probes; it shows only health and version);"
        " `false`: admins only",
    )
    BROKER_PUBLIC_METRICS = Setting(
        Flag(),
        False,
        "`/metrics` answers anyone; by default admins only (Prometheus can send a bearer token)",
    )
    BROKER_PRODUCER_CHANNELS = Setting(
        Choice(PRODUCER_CHANNEL_RULES),
        "open",
        "`open`: a producer publishes to any channel whose token it holds (webhook-broker's"
        " rule); `bound`: only to the channels it is allowed on (`channels` of"
        " `PUT /producer/{p}`, the seed's `[initial-producer-channels]`), else `403`"
        " ([api.md](api.md#producers-bound-to-channels))",
    )
    BROKER_ALLOW_PRIVATE_CALLBACKS = Setting(
        Flag(),
        False,
        "allow callback URLs on private, loopback or link-local addresses",
    )
    BROKER_DELIVERY_TIMEOUT_SECONDS = Setting(
        Integer(minimum=1),
        30,
        "push request timeout; also the base of every lease",
    )
    BROKER_DISPATCH_EVENT_LOOP = Setting(
        Choice(EVENT_LOOPS),
        "asyncio",
        "the dispatcher's event loop: `asyncio` (the standard library's) or `uvloop` (libuv; no"
        " steady gain measured in the drain, docs/performance.md)",
    )
    BROKER_CONSUMER_TOKEN_HEADER = Setting(
        Text(),
        "X-Broker-Consumer-Token",
        "the header that carries the consumer's token on push deliveries",
    )
    BROKER_DELIVERY_USER_AGENT = Setting(
        Text(),
        "",  # jobs/dispatch.py: webhook-broker-django/<version>
        "the `User-Agent` of push deliveries (webhook-broker's `[consumer-connection]"
        " user-agent`; set `Webhook Message Broker` for receivers that filter on its value)",
        shown_default="`webhook-broker-django/<version>`",
    )
    BROKER_RATIONAL_DELAY_SECONDS = Setting(Integer(minimum=0), 2, "grace added to every lease")
    BROKER_RETRY_DELAYS = Setting(
        Integers(minimum=0),
        [30, 120, 600, 1800, 3600, 7200, 21600, 43200],
        "seconds before each retry: 8 retries (9 attempts) over about 22 hours",
    )
    BROKER_RETRY_JITTER = Setting(
        Number(minimum=0.0, maximum=1.0),
        0.2,
        "± fraction applied to each delay (0 disables)",
    )
    BROKER_CIRCUIT_FAILURE_THRESHOLD = Setting(
        Integer(minimum=0),
        5,
        "consecutive failures that open a consumer's circuit (0 disables)",
    )
    BROKER_CIRCUIT_COOLDOWN_SECONDS = Setting(
        Integer(minimum=1),
        30,
        "first cooldown of an open circuit; doubles up to 3600",
    )
    BROKER_MAX_JOB_AGE_SECONDS = Setting(
        Integer(minimum=0),
        3 * 86400,
        "a push job still undelivered this long after it was queued (published, released,"
        " requeued or replayed) goes DEAD as `expired`; a consumer's `maxJobAge` overrides it;"
        " 0: no limit ([dispatcher.md](dispatcher.md#age-limit))",
        shown_default="`259200` (3 days)",
    )
    BROKER_MIN_SCHEDULE_DELAY_SECONDS = Setting(
        Integer(minimum=0),
        120,
        "earliest allowed `X-Broker-Scheduled-For`, in seconds from now (`412` if sooner); not"
        " applied to `publish(scheduled_for=…)` (see [scheduled.md](scheduled.md))",
    )
    BROKER_PULL_WAITERS_PER_PROCESS = Setting(
        Integer(minimum=0),
        2,
        "long-poll claims (`wait`) one web server process holds at once, each in a thread of"
        " its own; always fewer than gunicorn's `--threads`, so a thread is left for every other"
        " request. A claim beyond them is answered at once, with `Retry-After`"
        " ([api.md](api.md#pull-consumers)); `0`: no claim waits",
    )
    BROKER_PAYLOAD_OFFLOAD_BYTES = Setting(
        Integer(minimum=1),
        262144,
        "payloads above this (256 KiB) are kept in the payload storage instead of the database;"
        " at or below, in the message row",
    )
    BROKER_MAX_PAYLOAD_BYTES = Setting(
        Integer(minimum=1), 5242880, "larger payloads are refused (413)"
    )
    BROKER_MAX_BATCH_MESSAGES = Setting(
        Integer(minimum=1),
        1000,
        "most messages one `POST /channel/{c}/broadcast-batch` or `publish_many()` takes (more:"
        " `413`, nothing stored)",
    )
    BROKER_MAX_BATCH_BYTES = Setting(
        Integer(minimum=1),
        16777216,
        "largest body of a `POST /channel/{c}/broadcast-batch` (16 MiB), judged by"
        " `Content-Length` before the body is read (`413`)",
    )
    BROKER_PAYLOAD_STORAGE = Setting(
        Text(),
        "broker_payloads",
        "the key of Django's `STORAGES` that holds offloaded payloads (see"
        " [below](#payload-storage))",
    )
    BROKER_ENCRYPTION_KEYS = Setting(
        Items(),
        [],
        "Fernet keys, newest first, that encrypt consumer tokens and signing secrets at rest"
        " ([below](#encryption-keys))",
        secret=True,
        shown_default="derived from `DJANGO_SECRET_KEY`",
    )
    BROKER_RETENTION_DAYS = Setting(
        Integer(minimum=0),
        30,
        "housekeeping deletes fully delivered messages older than this, with their jobs and"
        " attempts (0 keeps them for ever); also `spark_etl archive`'s age limit",
    )
    BROKER_PARTITION_DAYS = Setting(
        Integer(minimum=1),
        7,
        "PostgreSQL: the days of jobs (and attempts) each time partition holds; retention drops"
        " whole partitions. The push claim plans only those from the oldest with pending work;"
        " other queries read them all: keep them few ([scaling](scaling.md#partitions))",
    )
    BROKER_LIVE_COUNT_MAX_JOBS = Setting(
        Integer(minimum=0),
        1_000_000,
        "`/job-status` counts DELIVERED jobs on each request (a read of the whole jobs table)"
        " while PostgreSQL estimates the table below this many jobs; from then on they come from"
        " the job status summary, refreshed every 5 minutes (`refreshedAt`); `0`: always the"
        " summary ([api.md](api.md#job-counts-live-or-from-the-summary))",
    )
    BROKER_LIVE_COUNT_MAX_STATUS_JOBS = Setting(
        Integer(minimum=0),
        2_000_000,
        "QUEUED, INFLIGHT and DEAD jobs (`/job-status`, `/dlq-status`, `/metrics`) are counted on"
        " each request, from the status's own index, while PostgreSQL estimates that index below"
        " this many jobs (about 0.1 s a million on 2 cores); above, they come from the job status"
        " summary; `0`: always the summary",
    )
    BROKER_UI_STATEMENT_TIMEOUT_SECONDS = Setting(
        Number(minimum=0.0, maximum=3600.0),
        10.0,
        "the longest one database statement of an operator UI page (`/ui/`) may run"
        " (`statement_timeout`, set for the page's queries alone); PostgreSQL then stops it and"
        " the page answers `503`, saying what to narrow, instead of holding a web server thread"
        " until gunicorn kills the worker ([ui.md](ui.md#statement-timeout)). `0`: no limit",
        shown_default="`10`",
    )
    BROKER_GATEWAY_AUTH_MODE = Setting(
        Choice(GATEWAY_AUTH_MODES),
        "none",
        "`none`: no check; `hmac`: every request outside the exempt paths needs a valid"
        " `X-Broker-Signature`",
        section=GATEWAY,
    )
    BROKER_GATEWAY_HMAC_SECRET = Setting(
        Text(),
        "",
        "the shared secret, base64 (`openssl rand -base64 32`); required, and must decode, with"
        " `hmac` (start-up stops otherwise, without echoing it)",
        section=GATEWAY,
        secret=True,
    )
    BROKER_GATEWAY_HMAC_TOLERANCE_SECONDS = Setting(
        Integer(minimum=1),
        300,
        "how far `t` may be from the broker's clock, either way",
        section=GATEWAY,
    )
    BROKER_GATEWAY_AUTH_EXEMPT_PATHS = Setting(
        Items(),
        ["/_status", "/metrics"],
        "comma-separated path prefixes that need no signature (probes and Prometheus cannot"
        " sign); empty: none",
        section=GATEWAY,
    )
    BROKER_BROADCAST_RATE_LIMIT = Setting(
        Number(minimum=0.0, maximum=1e6),
        0.0,
        "HTTP broadcasts per second allowed per producer, sustained (`0.5` is one every two"
        " seconds); `0` turns the limiter off",
        section=RATE_LIMIT,
        shown_default="`0` (off)",
    )
    BROKER_BROADCAST_BURST = Setting(
        Integer(minimum=0),
        0,
        "broadcasts a producer may send at once after a quiet spell",
        section=RATE_LIMIT,
        shown_default="`0` (= one second's worth, at least 1)",
    )
    BROKER_SCHEMA_STEPS_PER_SECOND = Setting(
        Integer(minimum=0),
        50_000,
        'steps of schema checking (docs/api.md, "Event type catalogue") each web process'
        " does per second for one producer, sustained; `0` turns the allowance off",
        section=RATE_LIMIT,
    )
