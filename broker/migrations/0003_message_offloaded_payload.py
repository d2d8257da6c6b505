# Offloaded payloads (docs/delivery.md, "Large payloads"): the storage name of a payload kept
# outside the row, and every payload's size. Existing messages all have their payload in the row:
# their size is its length.

from django.db import migrations, models
from django.db.models.functions import Length


def fill_payload_sizes(apps, schema_editor):
    Message = apps.get_model("broker", "Message")
    Message.objects.update(payload_size=Length("payload"))


class Migration(migrations.Migration):

    dependencies = [
        ("broker", "0002_message_ordering_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="payload_file",
            field=models.CharField(blank=True, default="", max_length=255),
        ),
        migrations.AddField(
            model_name="message",
            name="payload_size",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.RunPython(fill_payload_sizes, migrations.RunPython.noop),
        # purge_orphan_payloads: which stored files do messages name? Partial: inline payloads,
        # nearly all messages, are not in it.
        migrations.AddIndex(
            model_name="message",
            index=models.Index(
                condition=models.Q(("payload_file", ""), _negated=True),
                fields=["payload_file"],
                name="message_payload_file_idx",
            ),
        ),
    ]
