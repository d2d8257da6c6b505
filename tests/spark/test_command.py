"""`manage.py spark_etl` (the Django wrapper) and the nightly schedules."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django_q.models import Schedule  # type: ignore[import-untyped]

from jobs.models import DeliveryReport
from tests.spark.conftest import needs_spark
from tests.spark.history import make_history


@needs_spark
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("etl_config")
def test_manage_py_runs_the_report_with_the_django_database(spark, tmp_path):
    history = make_history()
    out = StringIO()
    call_command(
        "spark_etl", "report", "--until", history.until.isoformat(), "--output", str(tmp_path),
        stdout=out,
    )  # fmt: skip
    assert "report:" in out.getvalue()
    assert DeliveryReport.objects.filter(grain="day").count() == 3 * 4  # days x consumers
    assert (tmp_path / "report").is_dir()


@pytest.mark.django_db
def test_install_schedules_adds_and_removes_the_nightly_runs():
    call_command("install_schedules", "--spark", stdout=StringIO())
    runs = dict(Schedule.objects.filter(name__contains="spark_etl").values_list("name", "args"))
    assert runs == {
        "broker: spark_etl report": "'spark_etl', 'report'",
        "broker: spark_etl archive": "'spark_etl', 'archive'",
    }
    archive = Schedule.objects.get(name="broker: spark_etl archive")
    purge = Schedule.objects.get(name="broker: purge delivered messages")
    assert (archive.cron, purge.cron) == ("17 2 * * *", "17 3 * * *")  # archive, then purge

    call_command("install_schedules", stdout=StringIO())  # no flag: kept, brought up to date
    assert Schedule.objects.filter(name__contains="spark_etl").count() == 2
    call_command("install_schedules", "--no-spark", stdout=StringIO())
    assert not Schedule.objects.filter(name__contains="spark_etl").exists()
