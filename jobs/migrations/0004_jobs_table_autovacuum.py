"""Autovacuum settings for the jobs table (docs/queue-design.md).

Every job is updated at least twice (QUEUED -> INFLIGHT -> DELIVERED), and no update can be HOT
because the status is indexed, so each delivery leaves dead row versions and dead entries in the
partial indexes the claim reads. With the default thresholds (20 % of the table) a table of a
million jobs collects 200,000 of them before autovacuum starts and the claim slows as it steps over
them; at 1 % it is cleaned about twenty times as often.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_limit": "2000",  # let it finish quickly once started
}


def tune(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    options = ", ".join(f"{name} = {value}" for name, value in SETTINGS.items())
    schema_editor.execute(f"ALTER TABLE jobs_job SET ({options})")


def untune(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    schema_editor.execute(f"ALTER TABLE jobs_job RESET ({', '.join(SETTINGS)})")


class Migration(migrations.Migration):
    dependencies = [("jobs", "0003_ordering_keys")]

    operations = [migrations.RunPython(tune, untune)]
