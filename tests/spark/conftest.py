"""One SparkSession for every Spark test (starting one costs 5-20 s): local[2]
on loopback, quiet logs, the dledger data sources registered."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark_session():
    from spark.session import build_session

    session = build_session("local[2]", app_name="pydledger-tests", quick_start=True,
                            extra={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"})
    yield session
    session.stop()
