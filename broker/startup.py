"""Loading the settings at start-up: a bad value ends the process with one line, not a traceback.

Django imports the settings module lazily, deep inside whatever first needs a setting, so a
ConfigError from broker/settings_catalog/ (or an ImproperlyConfigured from broker/env.py or the
gateway check) would surface as a long traceback. The entry points (manage.py, broker.wsgi,
broker.asgi) load the settings first through `load_settings_or_exit` instead.
"""

from __future__ import annotations

import sys

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from broker.settings_catalog import ConfigError

CONFIGURATION_ERROR = 2  # the exit status of manage.py, as for a command-line usage error
# gunicorn stops for good when a worker exits with this status ("App failed to load."); with any
# other it would start new workers, each failing the same way, for ever.
GUNICORN_APP_LOAD_ERROR = 4


def load_settings_or_exit(exit_status: int = CONFIGURATION_ERROR) -> None:
    try:
        settings.INSTALLED_APPS  # noqa: B018 (the first read imports the settings module)
    except (ConfigError, ImproperlyConfigured) as exc:
        print(f"configuration error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(exit_status) from None
