#!/usr/bin/env python3
"""Django's command-line utility for the webhook broker."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    from django.core.management import execute_from_command_line

    from broker.startup import load_settings_or_exit

    load_settings_or_exit()

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
