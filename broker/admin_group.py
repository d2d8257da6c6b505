"""The group "broker admin": every right over the broker, given by adding a user to it.

Django ties permissions to models and creates them after migrations (post_migrate); this module
then makes the group hold every permission of the broker's apps, and keeps it so on every
`migrate`, permissions of later versions included. Narrower rights are groups of your own
(docs/ui.md, "Rights"). Nothing happens in a project without django.contrib.auth, such as one
that installs the apps only for the transactional outbox.
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.apps import apps as installed_apps

BROKER_ADMIN_GROUP = "broker admin"
BROKER_APPS = ("broker", "consumers", "jobs")


def sync_broker_admin_group(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    """post_migrate: give the group every permission of the broker's apps (once per app
    migrated; the last call sees them all)."""
    if sender.label not in BROKER_APPS or not installed_apps.is_installed("django.contrib.auth"):
        return
    from django.contrib.auth.models import Group, Permission

    group, _ = Group.objects.using(using).get_or_create(name=BROKER_ADMIN_GROUP)
    permissions = Permission.objects.using(using).filter(content_type__app_label__in=BROKER_APPS)
    group.permissions.add(*permissions)
