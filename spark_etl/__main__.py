"""`python -m spark_etl report|archive [--since T] [--until T] [--master URL]`.

The same file is what spark-submit runs on a cluster (docs/spark_etl.md):
`spark-submit --master spark://host:7077 --jars postgresql.jar spark_etl/__main__.py report`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

if __package__ in {None, ""}:  # run as a file by spark-submit: make the package importable
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout

from spark_etl import MISSING_PYSPARK, pyspark_installed
from spark_etl import config as etl_config
from spark_etl.config import moment

if not pyspark_installed():
    sys.exit(MISSING_PYSPARK)

from spark_etl import io, pipeline


def parser() -> argparse.ArgumentParser:
    commands = argparse.ArgumentParser(prog="python -m spark_etl", description=__doc__)
    commands.add_argument("job", choices=["report", "archive"])
    commands.add_argument(
        "--since",
        type=moment,
        help="report: recompute from this time (default: the watermark less the settle time);"
        " archive: only messages received since then",
    )
    commands.add_argument(
        "--until",
        type=moment,
        help="report: up to this time (default: now); archive: messages received before it"
        " (default: BROKER_RETENTION_DAYS ago)",
    )
    commands.add_argument("--master", help="Spark master URL (default: local[*])")
    commands.add_argument("--output", help="Parquet root (default: SPARK_ETL_OUTPUT)")
    return commands


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    overrides = {"master": args.master, "output": args.output}
    try:
        config = etl_config.from_environment(**{k: v for k, v in overrides.items() if v})
    except etl_config.ConfigError as error:
        parser().exit(2, f"spark_etl: {error}\n")
    spark = io.build_session(config)
    try:
        result: object
        if args.job == "report":
            result = pipeline.run_report(spark, config, since=args.since, until=args.until)
        else:
            result = pipeline.run_archive(spark, config, since=args.since, until=args.until)
    finally:
        spark.stop()
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
