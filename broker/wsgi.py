from __future__ import annotations

import os

from broker.startup import GUNICORN_APP_LOAD_ERROR, load_settings_or_exit
from broker.utf8_requests import wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
load_settings_or_exit(GUNICORN_APP_LOAD_ERROR)
application = wsgi_application()  # URLs and forms read as UTF-8
