"""A SparkSession for the replay job, the tests and the benchmark.

Local by default (local[N] on loopback); any master URL otherwise. What every
session here needs, whatever the master:
- the Python workers run this interpreter (PYSPARK_PYTHON), so they find
  pyarrow and this project (installed in the same environment);
- quiet logs: a log4j2 file that keeps Spark at WARN and silences the known
  harmless warnings (reference: shared toolchain notes, section 3);
- the `dledger` data sources registered;
- the JVM reader for batch reads on the classpath (spark/jvm_reader.py builds
  its jar; without `javac` the Python reader reads them, as it always could).
  `jvm_reader=False` leaves it out. Under spark-submit the JVM is already up:
  pass the jar with --jars (`python -c "from spark.jvm_reader import jar_path; print(jar_path())"`).
"""
from __future__ import annotations

import os
import socket
import sys
import tempfile
from typing import Any

from pyspark.sql import SparkSession

LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
logger.streaming.name = org.apache.spark.sql.execution.streaming
logger.streaming.level = error
logger.writeToStream.name = org.apache.spark.sql.catalyst.analysis.ResolveWriteToStream
logger.writeToStream.level = error
logger.scheduler.name = org.apache.spark.scheduler.DAGScheduler
logger.scheduler.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""


def log4j_config_path() -> str:
    directory = os.path.join(tempfile.gettempdir(), "pydledger-spark")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "log4j2.properties")
    if not os.path.exists(path) or open(path).read() != LOG4J2:
        with open(path + ".tmp", "w") as f:
            f.write(LOG4J2)
        os.replace(path + ".tmp", path)
    return path


# A JVM that starts faster and runs short jobs no slower: for tests, not for big replays.
QUICK_START_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def build_session(master: str | None = None, app_name: str = "dledger-replay",
                  extra: dict[str, Any] | None = None, quick_start: bool = False,
                  jvm_reader: bool = True) -> SparkSession:
    """Get or create the session. `master` None means local[2] on loopback,
    except under spark-submit, whose --master and --conf then decide."""
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the JVM for us
    local = not submitted and (master is None or master.startswith("local"))
    builder = SparkSession.builder.appName(app_name)
    if master is not None or not submitted:
        builder = builder.master(master or "local[2]")
    if not submitted:
        # Python workers run this interpreter, which has pyarrow and this
        # project (under spark-submit, its --conf spark.pyspark.python decides).
        os.environ["PYSPARK_PYTHON"] = sys.executable
        builder = builder.config("spark.pyspark.python", sys.executable)
    if local:
        # Otherwise Spark binds and announces the first non-loopback address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    elif not submitted and master is not None and master.startswith("spark://") \
            and "spark.driver.host" not in (extra or {}):
        # Executors connect back to the driver by the name it announces,
        # by default its host name, which other machines (or containers) may
        # not resolve: announce the address this host reaches the master from.
        address = address_towards(master)
        if address is not None:
            builder = builder.config("spark.driver.host", address)
    builder = (builder.config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j_config_path()}"
                       + (f" {QUICK_START_JAVA_OPTIONS}" if quick_start else "")))
    extra = dict(extra or {})
    if jvm_reader and not submitted:
        from spark.jvm_reader import jar_path

        jar = jar_path()
        if jar is not None:  # also shipped to executors elsewhere (spark.jars)
            extra["spark.jars"] = ",".join(j for j in (extra.get("spark.jars"), jar) if j)
    for key, value in extra.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def address_towards(master: str) -> str | None:
    """The local address this host uses to reach a spark://HOST:PORT master
    (a UDP socket's connect picks the route and sends nothing); None when
    the master's name does not resolve."""
    host, _, port = master.removeprefix("spark://").split(",")[0].rpartition(":")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port)))
            return str(probe.getsockname()[0])
    except (OSError, ValueError):
        return None


def register(spark: SparkSession) -> None:
    from spark.consume_queue_source import ConsumeQueueDataSource
    from spark.data_source import DLedgerDataSource, DLedgerPythonDataSource
    from spark.jvm_reader import on_classpath

    # With the JVM reader's jar on the classpath, "dledger" is its provider,
    # which hands what it does not read itself to the Python source by this other name.
    spark.dataSource.register(DLedgerPythonDataSource if on_classpath(spark) else DLedgerDataSource)
    spark.dataSource.register(ConsumeQueueDataSource)
