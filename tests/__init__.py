"""The test suite, grouped by area (README.md, "Run the tests"); shared helpers live here."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout: manage.py, docs/, templates/...
