"""How the tail job builds its SparkSession, decided without a JVM.

On a cluster a host without a daemon fails a task in milliseconds, and Spark's retries may all land on
that executor: the job excludes failed executors by default there. spark-submit's own settings (its
``--master``, ``--conf``) must stand, and a driver without ``PYSPARK_PYTHON`` is told that executors will
run ``python3``. The real spark-submit path is covered by integration/test_spark_submit.py.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")
from latticed.spark import tail_job
from latticed.spark.tail_job import plan_session

VENV = {"PYSPARK_PYTHON": "/opt/latticed/venv/bin/python"}
EXCLUDE = "spark.excludeOnFailure.enabled"


def test_outside_spark_submit_the_default_is_local_without_exclusion() -> None:
    plan = plan_session(None, {}, {})
    assert plan.master == "local[*]" and plan.local
    assert plan.config == {"spark.sql.shuffle.partitions": "4"}
    assert plan.warnings == ()  # locally the job sets PYSPARK_PYTHON itself (use_worker_python)
    assert plan_session("local[2]", {}, {}).config == {"spark.sql.shuffle.partitions": "4"}


@pytest.mark.parametrize(
    ("master", "submitted"),
    [
        ("spark://m1:7077", {}),
        (None, {"spark.master": "spark://m1:7077"}),
        (None, {"spark.master": "yarn"}),
    ],
)
def test_a_cluster_master_excludes_failed_executors(master: str | None, submitted: dict[str, str]) -> None:
    plan = plan_session(master, submitted, VENV)
    assert not plan.local
    assert plan.config[EXCLUDE] == "true"
    assert plan.master == master  # spark-submit's --master stands (None: not set again)
    assert plan.warnings == ()


def test_spark_submit_settings_stand() -> None:
    submitted = {"spark.master": "spark://m1:7077", EXCLUDE: "false", "spark.sql.shuffle.partitions": "8"}
    assert plan_session(None, submitted, VENV).config == {}
    legacy = {"spark.master": "spark://m1:7077", "spark.blacklist.enabled": "false"}
    assert EXCLUDE not in plan_session(None, legacy, VENV).config
    local = plan_session(None, {"spark.master": "local[1]"}, {})
    assert local.local and local.master is None and EXCLUDE not in local.config
    assert plan_session("spark://m2:7077", {"spark.master": "local[1]"}, VENV).master == "spark://m2:7077"


def test_a_cluster_driver_without_pyspark_python_is_warned() -> None:
    (warning,) = plan_session("spark://m1:7077", {}, {}).warnings
    assert "executors run `python3`" in warning
    assert "set PYSPARK_PYTHON on the driver (or spark.pyspark.python" in warning


class FakeBuilder:
    def __init__(self) -> None:
        self.master_url: str | None = None
        self.config_set: dict[str, str] = {}

    def appName(self, name: str) -> FakeBuilder:
        return self

    def master(self, url: str) -> FakeBuilder:
        self.master_url = url
        return self

    def config(self, key: str, value: str) -> FakeBuilder:
        self.config_set[key] = value
        return self

    def getOrCreate(self) -> str:
        return "session"


@pytest.fixture
def fake_spark(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {"builder": FakeBuilder(), "worker_python": 0}

    class FakeSparkSession:
        builder = seen["builder"]

        @staticmethod
        def getActiveSession() -> None:
            return None

    def worker_python() -> str:
        seen["worker_python"] += 1
        return "wrapper"

    monkeypatch.setattr(tail_job, "SparkSession", FakeSparkSession)
    monkeypatch.setattr(tail_job, "use_worker_python", worker_python)
    return seen


def test_session_applies_the_plan_on_a_cluster(
    fake_spark: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tail_job, "submitted_conf", lambda: {"spark.master": "spark://m1:7077"})
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert tail_job.session(None) == "session"
    builder = fake_spark["builder"]
    assert builder.master_url is None  # not local[*] over spark-submit's master
    assert builder.config_set[EXCLUDE] == "true"
    assert fake_spark["worker_python"] == 0  # the local wrapper would not exist on the executors' hosts
    assert "PYSPARK_PYTHON is not set" in capsys.readouterr().err


def test_session_applies_the_plan_locally(
    fake_spark: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tail_job, "submitted_conf", lambda: {})
    assert tail_job.session("local[2]", extra={"spark.sql.shuffle.partitions": "2"}) == "session"
    builder = fake_spark["builder"]
    assert builder.master_url == "local[2]"
    assert builder.config_set == {"spark.sql.shuffle.partitions": "2"}
    assert fake_spark["worker_python"] == 1


def test_no_jvm_is_started_outside_spark_submit() -> None:
    assert tail_job.submitted_conf({}) == {}
