"""Metadata headers that are never kept (broker.publishing.REFUSED_METADATA_HEADERS) leave the
messages and periodic messages that stored them before the rule: an X-Broker-Producer-Token kept
then would otherwise still reach pull consumers, and a periodic message would fail every tick."""

from django.db import migrations

from broker.publishing import is_refused_metadata_header

BATCH = 1000


def drop_refused_headers(apps, schema_editor):
    for model_name in ("Message", "PeriodicMessage"):
        model = apps.get_model("broker", model_name)
        changed = []
        for row in model.objects.exclude(headers={}).only("pk", "headers").iterator(BATCH):
            kept = {k: v for k, v in row.headers.items() if not is_refused_metadata_header(k)}
            if kept != row.headers:
                row.headers = kept
                changed.append(row)
            if len(changed) == BATCH:
                model.objects.bulk_update(changed, ["headers"])
                changed = []
        model.objects.bulk_update(changed, ["headers"])


class Migration(migrations.Migration):
    dependencies = [("broker", "0007_broker_admin_group")]

    operations = [migrations.RunPython(drop_refused_headers, migrations.RunPython.noop)]
