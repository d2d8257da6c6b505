"""The broker's own settings (`BROKER_*`), with their defaults in one place.

Code reads them through `broker_settings`, at each access, so `override_settings` works in tests
and a project that installs the apps (`pip install .`) needs to set only what it changes.
`broker/settings.py` takes its environment defaults from here too.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    "BROKER_ADMIN_TOKENS": [],
    "BROKER_OPEN_ADMIN_API": False,
    # /_status answers anyone (load balancer probes); false: admins only.
    "BROKER_PUBLIC_STATUS": True,
    # /metrics answers anyone; false (default): admins only (Prometheus can send a bearer token).
    "BROKER_PUBLIC_METRICS": False,
    "BROKER_ALLOW_PRIVATE_CALLBACKS": False,
    "BROKER_DELIVERY_TIMEOUT_SECONDS": 30,
    # The header that carries the consumer's token on push deliveries (as webhook-broker).
    "BROKER_CONSUMER_TOKEN_HEADER": "X-Broker-Consumer-Token",
    "BROKER_RATIONAL_DELAY_SECONDS": 2,
    # Eight retries over about 22 hours: 30 s, 2 min, 10 min, 30 min, 1 h, 2 h, 6 h, 12 h.
    "BROKER_RETRY_DELAYS": [30, 120, 600, 1800, 3600, 7200, 21600, 43200],
    "BROKER_RETRY_JITTER": 0.2,
    "BROKER_CIRCUIT_FAILURE_THRESHOLD": 5,
    "BROKER_CIRCUIT_COOLDOWN_SECONDS": 30,
    # A push job still undelivered this long after it was queued (published, released, requeued
    # or replayed) goes DEAD with reason "expired" (jobs/expiry.py); 0: no limit.
    "BROKER_MAX_JOB_AGE_SECONDS": 3 * 86400,
    "BROKER_MIN_SCHEDULE_DELAY_SECONDS": 120,
    "BROKER_PAYLOAD_OFFLOAD_BYTES": 262144,
    # The key of Django's STORAGES that holds offloaded payloads (SPEC §6.7).
    "BROKER_PAYLOAD_STORAGE": "broker_payloads",
    "BROKER_MAX_PAYLOAD_BYTES": 5242880,
    # Empty: one key derived from SECRET_KEY.
    "BROKER_ENCRYPTION_KEYS": [],
    # Housekeeping (django-q2 schedules): fully delivered messages older than this are deleted
    # with their jobs and attempts; 0 keeps them for ever.
    "BROKER_RETENTION_DAYS": 30,
    # HTTP broadcasts per second allowed per producer (broker/ratelimit.py); 0: not limited.
    "BROKER_BROADCAST_RATE_LIMIT": 0.0,
    # Broadcasts a producer may send at once after a quiet spell; 0: one second's worth.
    "BROKER_BROADCAST_BURST": 0,
    # The User-Agent of push deliveries (webhook-broker's [consumer-connection] user-agent);
    # empty: webhook-broker-django/<version>.
    "BROKER_DELIVERY_USER_AGENT": "",
    # webhook-broker's gateway authentication (broker/gateway_auth.py): "none" or "hmac".
    "BROKER_GATEWAY_AUTH_MODE": "none",
    "BROKER_GATEWAY_HMAC_SECRET": "",  # base64
    "BROKER_GATEWAY_HMAC_TOLERANCE_SECONDS": 300,
    # Path prefixes the check leaves alone (probes and Prometheus cannot sign).
    "BROKER_GATEWAY_AUTH_EXEMPT_PATHS": ["/_status", "/metrics"],
}


class BrokerSettings:
    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"{name} is not a broker setting")
        return getattr(settings, name, DEFAULTS[name])


broker_settings = BrokerSettings()
