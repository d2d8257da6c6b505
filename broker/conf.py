"""`broker_settings`: the broker's own settings (`BROKER_*`), typed, with their defaults.

The settings are declared once, in `broker/settings_catalog/` (`BrokerSettings`). Code reads
them here, from Django's settings at each access, so `override_settings` works in tests and a
project that installs the apps (`pip install .`) needs to set only what it changes: a setting it
leaves out has its declared default. An undeclared name is an AttributeError (and a mypy error).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from broker.settings_catalog import BrokerSettings, Setting


def _from_django_settings(setting: Setting[Any]) -> object:
    # LazySettings caches what it found, so a read per delivery stays an attribute lookup.
    return getattr(settings, setting.name, setting.default)


broker_settings = BrokerSettings(_from_django_settings)
