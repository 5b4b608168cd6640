package io.pydledger.spark;

import java.util.Map;

import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The format "dledger" when this jar is on the classpath (spark/jvm_reader.py
 * builds it, spark/session.py adds it). Spark looks up JVM sources before
 * Python ones, so this provider is what `format("dledger")` finds; it reads
 * batches itself (a node's files, or a running group's committed log over
 * gRPC: a columnar JVM reader, BatchTable) and hands everything else,
 * streams, the sink, the options only the Python reader has, to the Python
 * data source, registered
 * then as "dledger_python" (spark/data_source.py; Spark refuses a Python
 * source under a JVM source's name), through Spark's own
 * PythonDataSourceV2. The option reader=python forces the Python reader,
 * reader=jvm the JVM one (an error when it cannot take the options).
 */
public final class DLedgerSource implements TableProvider, DataSourceRegister {
    public static final String NAME = "dledger";
    /** The Python source's name when this provider has "dledger" (spark/data_source.py's PYTHON_FORMAT). */
    public static final String PYTHON_NAME = "dledger_python";
    private PythonDataSourceV2 python;

    @Override
    public String shortName() {
        return NAME;
    }

    private PythonDataSourceV2 python() {
        if (python == null) {
            python = new PythonDataSourceV2();
            python.setShortName(PYTHON_NAME);
        }
        return python;
    }

    /** The options (FileOptions or LiveOptions) when the JVM reader is to read, else null (the Python source reads). */
    static Object route(Map<String, String> options) {
        String reader = FileOptions.readerChoice(options);
        if (reader == null || reader.equals("python")) {
            return null;  // the Python source refuses an unknown reader value itself
        }
        boolean live = LiveOptions.live(options);
        String refusal = live ? LiveOptions.refusal(options) : FileOptions.refusal(options);
        if (refusal != null && reader.equals("jvm")) {
            throw new IllegalArgumentException("OptionError: reader=jvm: the JVM reader cannot read this query: "
                    + refusal + " (leave out reader, or give reader=python)");
        }
        if (refusal != null) {
            return null;
        }
        return live ? LiveOptions.parse(options) : FileOptions.parse(options);
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        Object taken = route(options);
        return taken instanceof FileOptions ? ((FileOptions) taken).schema()
                : taken instanceof LiveOptions ? ((LiveOptions) taken).schema() : python().inferSchema(options);
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        Object taken = route(properties);
        if (taken != null && FileOptions.acceptable(schema)) {
            return new BatchTable(schema, taken instanceof FileOptions ? (FileOptions) taken : null,
                    taken instanceof LiveOptions ? (LiveOptions) taken : null,
                    () -> python().getTable(schema, partitioning, properties));
        }
        return python().getTable(schema, partitioning, properties);
    }
}
