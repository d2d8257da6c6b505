"""`python -m broker.settings_catalog [--check] docs/configuration.md`: rewrite (or only check)
the page's generated tables (broker/settings_catalog/doc_tables.py)."""

import sys

from broker.settings_catalog.doc_tables import main

if __name__ == "__main__":
    sys.exit(main())
