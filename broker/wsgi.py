from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from broker.startup import GUNICORN_APP_LOAD_ERROR, load_settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
load_settings_or_exit(GUNICORN_APP_LOAD_ERROR)
application = get_wsgi_application()
