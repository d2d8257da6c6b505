"""The secondary indexes of the benches' big tables: dropped before a bulk load and built again
after it (bench/ui.py, bench/scale.py), then checked.

A partitioned table's index is given by pg_get_indexdef as `CREATE INDEX … ON ONLY table`, which
builds the parent's index alone, INVALID, and no partition's: the pages then read every
partition without an index (a dead jobs search took 76 s). The statements here build every
partition's index and attach it, and `require_valid_indexes` stops a build that left any index
invalid or unattached.
"""

from __future__ import annotations

from typing import Any

import psycopg

BIG_TABLES = ["broker_message", "jobs_job", "jobs_deliveryattempt"]
# Primary keys and the indexes of constraints (unique) stay through the load.
SECONDARY_INDEXES = """
SELECT c.relname, pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
WHERE t.relname = ANY(%s) AND NOT i.indisprimary
    AND NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = i.indexrelid)
"""


def secondary_indexes(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """The name of each secondary index of the big tables, and the statement that builds it
    again on the table and on each of its partitions."""
    found = conn.execute(SECONDARY_INDEXES, [BIG_TABLES]).fetchall()
    return [(name, on_every_partition(definition)) for name, definition in found]


def on_every_partition(definition: str) -> str:
    """`definition` (pg_get_indexdef's) without `ONLY`: on a partitioned table it then builds
    the index of every partition too, and the parent's index is valid."""
    return definition.replace(" ON ONLY ", " ON ", 1)


def require_valid_indexes(conn: psycopg.Connection[Any]) -> None:
    """Stop the bench, naming them, if an index of jobs, attempts or one of their partitions is
    invalid or unattached: the check migrations and partition maintenance pass
    (jobs.partitions.UNATTACHED_INDEXES_SQL). Django is set up by then (ui.django_here)."""
    from jobs.partitions import UNATTACHED_INDEXES_SQL

    bad = sorted(name for (name,) in conn.execute(UNATTACHED_INDEXES_SQL).fetchall())
    if bad:
        raise SystemExit(
            f"the build left {len(bad)} index(es) invalid or unattached: {', '.join(bad)};"
            " the pages would read every partition without them. Build again (--rebuild)."
        )
