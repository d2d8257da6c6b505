# Broker rights as Django permissions (docs/ui.md, "Rights"): two permissions that belong to no
# one model. The group "broker admin" that holds them all is kept by a post_migrate handler
# (broker/admin_group.py), so that a project without django.contrib.auth can still migrate.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('broker', '0006_message_channel_pending_index'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='apikey',
            options={'permissions': [('administer_broker', 'Can use the REST admin API with a login session'), ('manage_signing_secrets', 'Can reveal and rotate the signing secrets of consumers')]},
        ),
    ]
