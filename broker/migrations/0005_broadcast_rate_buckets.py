"""The broadcast rate limiter's buckets (broker/ratelimit.py): one row per producer.

A plain table without a model: only one SQL statement reads and writes it, and it holds nothing
an operator needs to see. `tat` is the theoretical arrival time (Unix seconds) of the producer's
next allowed broadcast. No foreign key: a deleted producer's row is harmless and tiny.
"""

from django.db import migrations

CREATE = (
    "CREATE TABLE broker_broadcast_rate ("
    " producer_id varchar(255) NOT NULL PRIMARY KEY,"
    " tat double precision NOT NULL)"
)


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0004_scheduled_and_periodic_messages"),
    ]

    operations = [
        migrations.RunSQL(CREATE, reverse_sql="DROP TABLE broker_broadcast_rate"),
    ]
