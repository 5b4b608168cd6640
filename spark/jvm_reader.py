"""The JVM reader for batch reads (file and live mode): its jar, built on first use.

`spark.read.format("dledger").load(PATH)` (and a live batch read) is fastest with a
DataSource V2 reader in Java (spark/jvm/src/io/pydledger/spark/): it fills
Spark's column vectors straight from the segment files, so Spark reads it as
it reads Parquet's vectorised batches, with no Python worker and no row copy
(docs/spark.md, "The JVM reader"). Its jar is compiled here with `javac`
against the installed pyspark's jars (no build tool) into a cache directory
keyed by a hash of the sources and the Spark version, so a change of either
builds a new one:

    $PYDLEDGER_JVM_CACHE or ~/.cache/pydledger/spark-jvm/<hash>/pydledger-spark.jar

`jar_path()` returns it, or None with the reason logged when it cannot be had
(no `javac`, sources missing, a compile error, PYDLEDGER_SPARK_JVM=0): the
Python reader then reads as before. spark/session.py puts the jar
on the session's classpath (spark.jars).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

SOURCES: Final = Path(__file__).parent / "jvm"
JAR_NAME: Final = "pydledger-spark.jar"
PROVIDER: Final = "io.pydledger.spark.DLedgerSource"

_built: dict[str, str | None] = {}


def cache_root() -> Path:
    configured = os.environ.get("PYDLEDGER_JVM_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "pydledger" / "spark-jvm"


def _inputs() -> list[Path]:
    return sorted(p for p in SOURCES.rglob("*") if p.is_file() and (p.suffix == ".java" or "resources" in p.parts))


def _key(files: list[Path], spark_version: str) -> str:
    digest = hashlib.sha256(spark_version.encode())
    for path in files:
        digest.update(str(path.relative_to(SOURCES)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def jar_path() -> str | None:
    """The reader's jar (built now if needed), or None, with the reason logged.
    PYDLEDGER_SPARK_JAR names a jar built beforehand (the Spark image ships
    one: it has neither the sources nor a compiler), used when it exists."""
    if os.environ.get("PYDLEDGER_SPARK_JVM", "1") == "0":
        return _unavailable("PYDLEDGER_SPARK_JVM=0")
    prebuilt = os.environ.get("PYDLEDGER_SPARK_JAR")
    if prebuilt and Path(prebuilt).is_file():
        return prebuilt
    import pyspark

    files = _inputs()
    if not any(p.suffix == ".java" for p in files):
        return _unavailable(f"no Java sources under {SOURCES}")
    key = _key(files, pyspark.__version__)
    if key in _built:
        return _built[key]
    jar = cache_root() / key / JAR_NAME
    if jar.exists():
        _built[key] = str(jar)
        return str(jar)
    javac = shutil.which("javac")
    if javac is None:
        return _remember(key, _unavailable("javac is not on PATH (install a JDK 17+)"))
    jars = Path(pyspark.__file__).parent / "jars"
    with tempfile.TemporaryDirectory(prefix="pydledger-jvm-") as work:
        classes = Path(work) / "classes"
        classes.mkdir()
        command = [javac, "-nowarn", "--release", "17", "-encoding", "UTF-8", "-d", str(classes),
                   "-cp", str(jars / "*"), *[str(p) for p in files if p.suffix == ".java"]]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            return _remember(key, _unavailable(f"javac failed: {done.stderr.strip()[:2000]}"))
        jar.parent.mkdir(parents=True, exist_ok=True)
        partial = jar.parent / f".{JAR_NAME}.{os.getpid()}"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: pydledger\n\n")
            for path in sorted(classes.rglob("*.class")):
                archive.write(path, str(path.relative_to(classes)))
            resources = SOURCES / "resources"
            for path in sorted(p for p in resources.rglob("*") if p.is_file()):
                archive.write(path, str(path.relative_to(resources)))
        os.replace(partial, jar)  # a concurrent builder writes the same bytes
    log.info("built the dledger JVM reader: %s", jar)
    return _remember(key, str(jar))


def _remember(key: str, value: str | None) -> str | None:
    _built[key] = value
    return value


def _unavailable(reason: str) -> None:
    log.warning("the dledger JVM reader is not available (%s): batch reads use the Python reader", reason)
    return None


def on_classpath(spark: object) -> bool:
    """Whether the session's JVM has the reader (spark.jars took effect)."""
    try:
        jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
        loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        jvm.java.lang.Class.forName(PROVIDER, False, loader)
        return True
    except Exception:  # noqa: BLE001 - py4j raises its own error types
        return False
