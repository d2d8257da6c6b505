from __future__ import annotations

import os

from django.apps import AppConfig
from django.db import connections
from django.db.models.signals import post_migrate


class BrokerConfig(AppConfig):
    name = "broker"
    verbose_name = "Broker"

    def ready(self) -> None:
        from broker import (
            checks,  # noqa: F401  (registers the system checks)
            tracing,
        )
        from broker.admin_group import sync_broker_admin_group
        from broker.api import schema  # noqa: F401  (registers OpenAPI extensions)

        post_migrate.connect(sync_broker_admin_group)

        # OpenTelemetry, when the OTEL_* variables ask for it; a bad value stops start-up here.
        tracing.configure()

        os.register_at_fork(before=close_connection_pools)


def close_connection_pools() -> None:
    """Close this process's PostgreSQL connection pools (registered to run right before the
    process forks).

    django-q2's cluster forks its workers from a process that has used the database (gunicorn
    with --preload would too). A pool's threads do not survive fork(), and the child would take
    the idle connections it inherited, whose sessions the parent keeps using: two processes'
    queries on one session. Closed here, parent and child each open a pool of their own on
    their next query; connections in use elsewhere in the parent close when they come back.
    """
    for wrapper in connections.all():
        # Only a pool this process opened: asking Django for one (close_pool() does) would
        # open it. The forking thread's own connection is handed back first, or the child
        # would inherit its session. close_pool() is PostgreSQL's (Django 5.1); django-stubs
        # does not know the pools yet. The broker's own databases are PostgreSQL, but a host
        # project (docs/outbox.md) may have others beside them, without pools.
        if wrapper.vendor == "postgresql" and wrapper.alias in type(wrapper)._connection_pools:  # type: ignore[attr-defined]
            wrapper.close()
            wrapper.close_pool()  # type: ignore[attr-defined]
