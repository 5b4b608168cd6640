"""The Spark replay of the committed log (issue 6): a PySpark data source `dledger` and the replay job."""
