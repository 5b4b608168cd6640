package io.pydledger.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.EnumSet;
import java.util.List;
import java.util.Set;
import java.util.function.Supplier;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A node's files (file mode) or a running group (live mode) as a table:
 * batch reads by the JVM reader (column pruning, columnar batches); a stream,
 * or a write, goes to the Python source's table (its stream reader, its sink).
 */
final class BatchTable implements Table, SupportsRead, SupportsWrite {
    private final StructType schema;
    private final FileOptions options;  // file mode, else null
    private final LiveOptions live;  // live mode, else null
    private final Supplier<Table> python;
    private Table pythonTable;

    BatchTable(StructType schema, FileOptions options, LiveOptions live, Supplier<Table> python) {
        this.schema = schema;
        this.options = options;
        this.live = live;
        this.python = python;
    }

    /** The topic filter, as the (serializable) factory holds it; null: every row. */
    private java.util.HashSet<String> topics() {
        Set<String> topics = options != null ? options.topics : live.topics;
        return topics == null ? null : new java.util.HashSet<>(topics);
    }

    private Table python() {
        if (pythonTable == null) {
            pythonTable = python.get();
        }
        return pythonTable;
    }

    @Override
    public String name() {
        return DLedgerSource.NAME;
    }

    @Override
    public StructType schema() {
        return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
        Set<TableCapability> capabilities = EnumSet.of(TableCapability.BATCH_READ);
        capabilities.addAll(python().capabilities());
        return capabilities;
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap scanOptions) {
        return new Builder(scanOptions);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        return ((SupportsWrite) python()).newWriteBuilder(info);
    }

    private final class Builder implements ScanBuilder, SupportsPushDownRequiredColumns {
        private final CaseInsensitiveStringMap scanOptions;
        private StructType required = schema;

        Builder(CaseInsensitiveStringMap scanOptions) {
            this.scanOptions = scanOptions;
        }

        @Override
        public void pruneColumns(StructType requiredSchema) {
            required = requiredSchema;
        }

        @Override
        public Scan build() {
            return new LogScan(required, scanOptions);
        }
    }

    private final class LogScan implements Scan, Batch {
        private final StructType read;
        private InputPartition[] planned;
        private final CaseInsensitiveStringMap scanOptions;

        LogScan(StructType read, CaseInsensitiveStringMap scanOptions) {
            this.read = read;
            this.scanOptions = scanOptions;
        }

        @Override
        public StructType readSchema() {
            return read;
        }

        @Override
        public String description() {
            return "dledger JVM reader " + (options != null ? options.path
                    : "live " + String.join(",", live.servers) + " group " + live.group);
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
            return ((SupportsRead) python()).newScanBuilder(scanOptions).build().toMicroBatchStream(checkpointLocation);
        }

        /**
         * Planned once per scan: Spark may ask more than once, and a live
         * group's committed index moves, so a second plan could differ.
         */
        @Override
        public synchronized InputPartition[] planInputPartitions() {
            if (planned == null) {
                try {
                    planned = (options != null ? LogFiles.planBatch(options) : planLive()).toArray(new InputPartition[0]);
                } catch (IOException error) {
                    throw new UncheckedIOException(error.getMessage(), error);
                }
            }
            return planned.clone();
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new Factory(read, topics());
        }
    }

    /**
     * As spark/data_source.py plans a live batch: the committed index is read
     * once, here, so the ranges (and the query's result) are fixed whatever
     * is committed later.
     */
    private List<LiveRange> planLive() throws IOException {
        live.access.check();
        LiveGroup.View view = LiveGroup.view(live.servers, live.group, live.access);
        long[] range = LogFiles.batchRange(live.startIndex, live.startingIndex, live.endIndex, view.begin,
                view.committed);
        return LiveRange.plan(live, range[0], range[1], live.preferReplicas ? view.followers : List.of());
    }

    static final class Factory implements PartitionReaderFactory {
        private static final long serialVersionUID = 1L;
        private final StructType schema;
        private final java.util.HashSet<String> topics;

        Factory(StructType schema, java.util.HashSet<String> topics) {
            this.schema = schema;
            this.topics = topics;
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            throw new UnsupportedOperationException("the dledger JVM reader reads column batches only");
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            try {
                return partition instanceof LiveRange ? new RangeReader((LiveRange) partition, schema, topics)
                        : new RangeReader((FileRange) partition, schema, topics);
            } catch (IOException error) {
                throw new UncheckedIOException(error);
            }
        }
    }
}
