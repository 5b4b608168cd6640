package io.pydledger.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * Entries firstIndex..lastIndex of one data segment (spark/partitions.py's
 * FileRange): the first at absolute position pos (-1: found by walking the
 * segment's headers), previousChainCrc links it to the entry before (-1: not
 * checked). Only paths and numbers: an executor elsewhere reads the same files.
 */
final class FileRange implements InputPartition {
    private static final long serialVersionUID = 1L;

    final String path;
    final long segmentStart;
    final long segmentSize;
    final long firstIndex;
    final long lastIndex;
    final long pos;
    final long previousChainCrc;

    FileRange(String path, long segmentStart, long segmentSize, long firstIndex, long lastIndex, long pos,
              long previousChainCrc) {
        this.path = path;
        this.segmentStart = segmentStart;
        this.segmentSize = segmentSize;
        this.firstIndex = firstIndex;
        this.lastIndex = lastIndex;
        this.pos = pos;
        this.previousChainCrc = previousChainCrc;
    }
}
