"""Metadata headers that are never kept (broker/publishing.py, as the rule stood when this was
written: frozen here so that later changes of the rule do not change this migration) leave the
messages and periodic messages that stored them before it: an X-Broker-Producer-Token kept then
would otherwise still reach pull consumers, and a periodic message would fail every tick."""

from django.db import migrations

BATCH = 1000
REFUSED = {
    "connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "expect", "host",
    "content-length", "authorization", "cookie", "forwarded", "x-real-ip",
}
REFUSED_PREFIXES = ("proxy-", "x-forwarded-", "x-broker-", "webhook-")


def refused(name):
    name = name.lower()
    return name in REFUSED or name.startswith(REFUSED_PREFIXES)


def drop_refused_headers(apps, schema_editor):
    for model_name in ("Message", "PeriodicMessage"):
        model = apps.get_model("broker", model_name)
        changed = []
        for row in model.objects.exclude(headers={}).only("pk", "headers").iterator(BATCH):
            kept = {name: value for name, value in row.headers.items() if not refused(name)}
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
