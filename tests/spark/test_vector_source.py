"""The `dledger` data source in file mode decodes with the vectorised decoder:
through Spark, the rows of the mixed corpus equal the reference decoder's,
and a query's own (smaller) schema is honoured."""
from __future__ import annotations

import datetime

import pytest
from pyspark.sql.functions import unix_micros

from tests.spark.test_vector_decode import build_corpus, ranges, reference_table

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def test_spark_reads_the_mixed_corpus_as_the_reference_decodes_it(spark_session, tmp_path):
    committed = build_corpus(tmp_path)
    expected = reference_table(ranges(tmp_path, committed)).to_pylist()
    df = spark_session.read.format("dledger").option("maxPartitionBytes", str(256 << 10)).load(str(tmp_path))
    assert df.rdd.getNumPartitions() > 3
    # Timestamps compared as microseconds (collect() hands back naive local times).
    rows = [row.asDict() for row in df.withColumn("born_timestamp", unix_micros("born_timestamp"))
            .withColumn("store_timestamp", unix_micros("store_timestamp")).orderBy("index").collect()]
    for row in expected:  # Spark hands maps back as dicts
        row["properties"] = None if row["properties"] is None else dict(row["properties"])
        for name in ("born_timestamp", "store_timestamp"):
            row[name] = None if row[name] is None else (row[name] - EPOCH) // datetime.timedelta(microseconds=1)
    assert len(rows) == len(expected)
    for got, want in zip(rows, expected):
        assert got == want, f"index {want['index']}"
    # A query's own schema: only these columns are decoded, and it may call them nullable.
    pruned = spark_session.read.format("dledger").schema("index LONG, topic STRING, queue_offset LONG, keys ARRAY<STRING>") \
        .load(str(tmp_path)).where("topic = 'Payments'").orderBy("index").collect()
    assert [tuple(r) for r in pruned] == [(w["index"], w["topic"], w["queue_offset"], w["keys"]) for w in expected
                                          if w["topic"] == "Payments"]
    with pytest.raises(Exception, match="did you mean startIndex"):  # a typo is refused, not ignored
        spark_session.read.format("dledger").option("startIndx", "40").load(str(tmp_path)).collect()
    with pytest.raises(Exception, match="no column 'bodyy'"):
        spark_session.read.format("dledger").schema("index LONG, bodyy BINARY").load(str(tmp_path)).collect()
