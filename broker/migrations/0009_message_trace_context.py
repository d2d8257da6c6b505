"""The W3C trace context a message keeps for its deliveries (broker/tracing.py,
docs/observability.md). Nullable columns without a default: adding them rewrites no row, and
messages published before have none."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0008_drop_refused_metadata_headers"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="traceparent",
            field=models.CharField(blank=True, max_length=55, null=True),
        ),
        migrations.AddField(
            model_name="message",
            name="tracestate",
            field=models.CharField(blank=True, max_length=512, null=True),
        ),
    ]
