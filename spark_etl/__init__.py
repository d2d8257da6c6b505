"""Delivery analytics and archival on PySpark (docs/spark_etl.md). Importable without Django.

PySpark is an optional part of the broker: a broker without it runs, and spark_etl says how to
install it.
"""

from __future__ import annotations

import importlib.util

MISSING_PYSPARK = (
    "spark_etl needs PySpark, an optional part of the broker: pip install -r requirements-spark.txt"
    " in a clone, or pip install 'webhook-broker-django[spark]' (and Java 17; docs/spark_etl.md)"
)


def pyspark_installed() -> bool:
    return importlib.util.find_spec("pyspark") is not None
