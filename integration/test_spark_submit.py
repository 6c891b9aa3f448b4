"""The tail job under a real ``spark-submit``: spark-submit's ``--master`` and ``--conf`` stand.

Before, the job's session read a SparkConf made before connecting to spark-submit's JVM (always empty),
so it set ``local[*]`` over any submitted master: a job submitted to a cluster ran on the driver alone.
One JVM start (~10 s); no daemon needed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

PROBE = """\
from latticed.spark import tail_job
spark = tail_job.session(None)
conf = spark.sparkContext.getConf()
print("PROBE", spark.sparkContext.master, conf.get("spark.sql.shuffle.partitions"),
      conf.get("spark.excludeOnFailure.enabled", "unset"))
spark.stop()
"""


def test_spark_submit_master_and_conf_stand(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")
    submit = Path(sys.executable).parent / "spark-submit"
    if not submit.exists() or (shutil.which("java") is None and not os.environ.get("JAVA_HOME")):
        pytest.skip("needs pyspark's spark-submit and a JDK (17)")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    jvm = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    argv = [
        str(submit),
        "--master",
        "local[1]",
        "--conf",
        "spark.sql.shuffle.partitions=3",
        "--conf",
        "spark.ui.enabled=false",
        "--driver-java-options",
        jvm,
        str(probe),
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=150, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    assert lines == ["PROBE local[1] 3 unset"]  # was "local[*] 4 unset"
