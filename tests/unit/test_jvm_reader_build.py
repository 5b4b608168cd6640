"""spark/jvm_reader.py: without javac (or when turned off) there is no jar and
the reason is logged, so file mode falls back to the Python reader; with one,
a second call reuses the jar of the same sources."""
from __future__ import annotations

import logging
import shutil

import pytest

pytest.importorskip("pyspark")

from spark import jvm_reader  # noqa: E402


@pytest.fixture()
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("PYDLEDGER_JVM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(jvm_reader, "_built", {})
    return tmp_path / "cache"


def test_without_javac_there_is_no_jar_and_the_reason_is_logged(fresh, monkeypatch, caplog):
    monkeypatch.setattr(jvm_reader.shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger="spark.jvm_reader"):
        assert jvm_reader.jar_path() is None
    assert "javac is not on PATH" in caplog.text and "Python reader" in caplog.text


def test_turned_off_by_the_environment(fresh, monkeypatch, caplog):
    monkeypatch.setenv("PYDLEDGER_SPARK_JVM", "0")
    with caplog.at_level(logging.WARNING, logger="spark.jvm_reader"):
        assert jvm_reader.jar_path() is None
    assert "PYDLEDGER_SPARK_JVM=0" in caplog.text


@pytest.mark.skipif(shutil.which("javac") is None, reason="no javac on PATH")
def test_the_jar_is_built_once_per_sources(fresh, monkeypatch):
    import zipfile

    jar = jvm_reader.jar_path()
    assert jar is not None and jar.startswith(str(fresh))
    names = zipfile.ZipFile(jar).namelist()
    assert "io/pydledger/spark/DLedgerSource.class" in names
    assert "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister" in names
    monkeypatch.setattr(jvm_reader, "_built", {})
    monkeypatch.setattr(jvm_reader.subprocess, "run", lambda *a, **k: pytest.fail("built again"))
    assert jvm_reader.jar_path() == jar


def test_a_jar_built_beforehand_is_used_as_it_is(tmp_path, monkeypatch):
    # The Spark image ships the jar without the sources or a compiler.
    jar = tmp_path / "pydledger-spark.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setenv("PYDLEDGER_SPARK_JAR", str(jar))
    monkeypatch.setattr(jvm_reader, "SOURCES", tmp_path / "none")
    assert jvm_reader.jar_path() == str(jar)
    monkeypatch.setenv("PYDLEDGER_SPARK_JAR", str(tmp_path / "missing.jar"))   # not there: as without it
    assert jvm_reader.jar_path() is None
