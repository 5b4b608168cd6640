package io.pydledger.spark;

import java.io.File;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * A node's log files, read only, and the planning of a query over them: the
 * Java twin of spark/log_files.py and spark/partitions.py (same layout, same
 * committed cut from the checkpoint, same ranges, same errors).
 */
final class LogFiles {
    static final String NODE_DIR_PREFIX = "dledger-";
    static final int HEADER_SIZE = 48;
    static final int INDEX_RECORD_SIZE = 32;
    static final int MAGIC_NORMAL = 1, MAGIC_BLANK = -1;
    static final long MIN_PARTITION_BYTES = 4L << 20;

    static boolean validMagic(int magic) {
        return magic >= 1 && magic <= 4;  // NORMAL, NOOP, CONFIG_CHANGE, PRODUCER_MARK
    }

    /** One fixed-size file covering absolute offsets [start, start + size). */
    static final class Segment {
        final String path;
        final long start;
        final long size;

        Segment(String path, long start, long size) {
            this.path = path;
            this.start = start;
            this.size = size;
        }

        long end() {
            return start + size;
        }
    }

    final String baseDir;
    final Segment[] data;
    final Segment[] index;
    final Long committedIndex;  // null: no checkpoint

    private LogFiles(String baseDir, Segment[] data, Segment[] index, Long committedIndex) {
        this.baseDir = baseDir;
        this.data = data;
        this.index = index;
        this.committedIndex = committedIndex;
    }

    static LogFiles locate(String path, String nodeId) {
        File dir = new File(path).getAbsoluteFile();
        String abs = dir.getPath();
        if (!dir.isDirectory()) {
            throw new LogFilesException(abs + ": no such directory");
        }
        if (new File(dir, "data").isDirectory()) {
            return open(dir);
        }
        List<String> nodes = new ArrayList<>();
        String[] names = dir.list();
        if (names != null) {
            Arrays.sort(names);
            for (String n : names) {
                if (n.startsWith(NODE_DIR_PREFIX) && new File(dir, n).isDirectory()) {
                    nodes.add(n);
                }
            }
        }
        if (nodeId != null) {
            String wanted = NODE_DIR_PREFIX + nodeId;
            if (!nodes.contains(wanted)) {
                throw new LogFilesException(abs + ": no " + wanted + "/ (found "
                        + (nodes.isEmpty() ? "none" : String.join(", ", nodes)) + ")");
            }
            return open(new File(dir, wanted));
        }
        if (nodes.size() == 1) {
            return open(new File(dir, nodes.get(0)));
        }
        if (nodes.size() > 1) {
            throw new LogFilesException(abs + " holds the logs of several nodes (" + String.join(", ", nodes)
                    + "); choose one with the nodeId option");
        }
        Segment[] copy = segmentsIn(dir);
        if (copy.length > 0) {
            return new LogFiles(abs, copy, new Segment[0], checkpoint(new File(dir, "checkpoint")));
        }
        throw new LogFilesException(abs + " holds no DLedger log (no dledger-<id>/, data/ or data segments)");
    }

    private static LogFiles open(File base) {
        return new LogFiles(base.getPath(), segmentsIn(new File(base, "data")), segmentsIn(new File(base, "index")),
                checkpoint(new File(base, "checkpoint")));
    }

    private static Long checkpoint(File file) {
        if (!file.exists()) {
            return null;
        }
        try {
            for (String raw : Files.readAllLines(file.toPath(), StandardCharsets.UTF_8)) {
                String line = raw.strip();
                if (line.isEmpty() || line.startsWith("#") || line.startsWith("!")) {
                    continue;
                }
                int eq = line.indexOf('=');
                String key = (eq < 0 ? line : line.substring(0, eq)).strip();
                if (key.equals("committedIndex")) {
                    return Long.valueOf(eq < 0 ? "" : line.substring(eq + 1).strip());
                }
            }
        } catch (IOException | NumberFormatException error) {
            throw new LogFilesException("checkpoint " + file.getAbsolutePath() + " has no readable committedIndex ("
                    + error + ")");
        }
        throw new LogFilesException("checkpoint " + file.getAbsolutePath()
                + " has no readable committedIndex ('committedIndex')");
    }

    private static Segment[] segmentsIn(File dir) {
        String[] names = dir.isDirectory() ? dir.list() : null;
        if (names == null) {
            return new Segment[0];
        }
        List<Segment> found = new ArrayList<>();
        for (String name : names) {
            if (name.length() != 20 || !name.chars().allMatch(c -> c >= '0' && c <= '9')) {
                continue;
            }
            File f = new File(dir, name);
            found.add(new Segment(f.getPath(), Long.parseLong(name), f.length()));
        }
        found.sort((a, b) -> Long.compare(a.start, b.start));
        for (int k = 1; k < found.size(); k++) {
            if (found.get(k - 1).end() != found.get(k).start) {
                throw new LogFilesException(dir.getPath() + ": segment " + found.get(k).path + " does not follow "
                        + found.get(k - 1).path);
            }
        }
        return found.toArray(new Segment[0]);
    }

    static byte[] pread(String path, long offset, int length) {
        try (RandomAccessFile f = new RandomAccessFile(path, "r")) {
            ByteBuffer buffer = ByteBuffer.allocate(length);
            while (buffer.hasRemaining()) {
                int n = f.getChannel().read(buffer, offset + buffer.position());
                if (n < 0) {
                    break;
                }
            }
            return Arrays.copyOf(buffer.array(), buffer.position());
        } catch (IOException error) {
            throw new LogFilesException(path + ": " + error);
        }
    }

    static int int32(byte[] b, int at) {
        return ((b[at] & 0xff) << 24) | ((b[at + 1] & 0xff) << 16) | ((b[at + 2] & 0xff) << 8) | (b[at + 3] & 0xff);
    }

    static long int64(byte[] b, int at) {
        return ((long) int32(b, at) << 32) | (int32(b, at + 4) & 0xffffffffL);
    }

    /** (index, pos) of the first entry in the segment, or null when it holds none. */
    long[] firstEntryOf(Segment segment) {
        long at = 0;
        while (at + HEADER_SIZE <= segment.size) {
            byte[] header = pread(segment.path, at, HEADER_SIZE);
            if (header.length < HEADER_SIZE) {
                return null;
            }
            int magic = int32(header, 0), size = int32(header, 4);
            if (magic == MAGIC_BLANK && at == 0 && size >= 8) {
                at = size;
                continue;
            }
            if (!validMagic(magic)) {
                return null;
            }
            long pos = int64(header, 24);
            if (pos != segment.start + at) {
                throw new LogFilesException(segment.path + ": entry at offset " + at + " says pos " + pos);
            }
            return new long[] {int64(header, 8), segment.start + at};
        }
        return null;
    }

    /** (pos, size) of entry `index` from the index files, or null. */
    long[] indexRecord(long entry) {
        long offset = entry * INDEX_RECORD_SIZE;
        Segment segment = find(index, offset);
        if (segment == null) {
            return null;
        }
        byte[] r = pread(segment.path, offset - segment.start, INDEX_RECORD_SIZE);
        if (r.length != INDEX_RECORD_SIZE) {
            return null;
        }
        int magic = int32(r, 0), size = int32(r, 12);
        if (!validMagic(magic) || int64(r, 16) != entry || size < HEADER_SIZE) {
            return null;
        }
        return new long[] {int64(r, 4), size};
    }

    long chainCrcAt(long pos) {
        Segment segment = find(data, pos);
        if (segment == null) {
            throw new LogFilesException("no data segment holds position " + pos);
        }
        byte[] header = pread(segment.path, pos - segment.start, HEADER_SIZE);
        return int32(header, 36) & 0xffffffffL;
    }

    private static Segment find(Segment[] segments, long offset) {
        if (segments.length == 0 || offset < segments[0].start) {
            return null;
        }
        long k = (offset - segments[0].start) / segments[0].size;
        return k < segments.length ? segments[(int) k] : null;
    }

    // ------------------------------------------------------------ planning

    static final class Span {
        final Segment segment;
        final long firstIndex;
        final long firstPos;

        Span(Segment segment, long firstIndex, long firstPos) {
            this.segment = segment;
            this.firstIndex = firstIndex;
            this.firstPos = firstPos;
        }
    }

    List<Span> spans() {
        List<Span> spans = new ArrayList<>();
        for (Segment segment : data) {
            long[] first = firstEntryOf(segment);
            if (first != null) {
                spans.add(new Span(segment, first[0], first[1]));
            }
        }
        return spans;
    }

    /** (begin index, committed index): FileLog.bounds. */
    long[] bounds(List<Span> spans, Long endIndex) {
        long committed;
        if (committedIndex == null) {
            if (endIndex == null) {
                throw new LogFilesException(baseDir + " has no checkpoint, so which entries are committed is "
                        + "unknown; give the last committed index as the endIndex option");
            }
            committed = endIndex;
        } else {
            committed = committedIndex;
        }
        return new long[] {spans.isEmpty() ? committed + 1 : spans.get(0).firstIndex, committed};
    }

    /** DLedgerBatchReader.partitions: the ranges of a batch query. */
    static List<FileRange> planBatch(FileOptions options) {
        LogFiles files = locate(options.path, options.nodeId);
        List<Span> spans = files.spans();
        long[] bounds = files.bounds(spans, options.endIndex);
        long[] range = batchRange(options.startIndex, options.startingIndex, options.endIndex, bounds[0], bounds[1]);
        if (range[0] > range[1]) {
            return new ArrayList<>();
        }
        return files.plan(spans, range[0], range[1], options.maxPartitionBytes, options.minPartitions);
    }

    /**
     * The entries [first, last] a batch reads, as spark/data_source.py plans
     * them: from startIndex, else startingOffsets as an index, else the log's
     * beginning; up to endIndex, at most the committed index.
     */
    static long[] batchRange(Long startIndex, Long startingIndex, Long endIndex, long begin, long committed) {
        long first = startIndex != null ? startIndex : startingIndex != null ? startingIndex : begin;
        if (first < begin) {
            throw new LogFilesException("startIndex " + first + " is below the first entry still in the log (" + begin
                    + "); retention deleted the entries before it");
        }
        return new long[] {first, endIndex == null ? committed : Math.min(endIndex, committed)};
    }

    List<FileRange> plan(List<Span> spans, long firstIndex, long lastIndex, long maxPartitionBytes,
                         int minPartitions) {
        if (minPartitions > 1 && firstIndex <= lastIndex) {
            long[] first = indexRecord(firstIndex), last = indexRecord(lastIndex);
            if (first != null && last != null) {
                long total = last[0] + last[1] - first[0];
                long count = Math.max(minPartitions, ceilDiv(total, maxPartitionBytes));
                count = ceilDiv(count, minPartitions) * minPartitions;
                maxPartitionBytes = Math.max(MIN_PARTITION_BYTES, ceilDiv(total, count));
            }
        }
        List<FileRange> ranges = new ArrayList<>();
        for (int k = 0; k < spans.size(); k++) {
            Span span = spans.get(k);
            long spanLast = k + 1 < spans.size() ? spans.get(k + 1).firstIndex - 1 : lastIndex;
            long low = Math.max(firstIndex, span.firstIndex), high = Math.min(lastIndex, spanLast);
            if (low > high) {
                continue;
            }
            ranges.addAll(split(span, low, high, maxPartitionBytes));
        }
        checkCoverage(ranges, firstIndex, lastIndex, spans);
        return ranges;
    }

    private static long ceilDiv(long a, long b) {
        return -Math.floorDiv(-a, b);
    }

    private List<FileRange> split(Span span, long low, long high, long maxPartitionBytes) {
        Segment segment = span.segment;
        long[] lowRecord = low != span.firstIndex ? indexRecord(low) : new long[] {span.firstPos, 0};
        long[] highRecord = indexRecord(high);
        List<FileRange> ranges = new ArrayList<>();
        if (lowRecord == null || highRecord == null) {
            long pos = low == span.firstIndex ? span.firstPos : -1;
            ranges.add(new FileRange(segment.path, segment.start, segment.size, low, high, pos, -1));
            return ranges;
        }
        long spanBytes = highRecord[0] + highRecord[1] - lowRecord[0];
        long parts = Math.max(1, Math.min(high - low + 1, ceilDiv(spanBytes, maxPartitionBytes)));
        long[] bounds = new long[(int) parts + 1];
        for (int i = 0; i < parts; i++) {
            bounds[i] = low + (high - low + 1) * i / parts;
        }
        bounds[(int) parts] = high + 1;
        for (int i = 0; i < parts; i++) {
            long first = bounds[i];
            long[] record = first == low ? lowRecord : indexRecord(first);
            if (record == null) {
                throw new LogFilesException(baseDir + ": no index record for entry " + first);
            }
            ranges.add(new FileRange(segment.path, segment.start, segment.size, first, bounds[i + 1] - 1, record[0],
                    previousChainCrc(first)));
        }
        return ranges;
    }

    private long previousChainCrc(long entry) {
        long[] previous = entry > 0 ? indexRecord(entry - 1) : null;
        return previous == null ? -1 : chainCrcAt(previous[0]);
    }

    private static void checkCoverage(List<FileRange> ranges, long firstIndex, long lastIndex, List<Span> spans) {
        if (firstIndex > lastIndex) {
            return;
        }
        Long begin = spans.isEmpty() ? null : spans.get(0).firstIndex;
        if (begin == null || begin > firstIndex) {
            throw new LogFilesException("entries from " + firstIndex + " were asked for but the log's files begin at "
                    + (begin == null ? "no entry" : begin.toString()));
        }
        long expected = firstIndex;
        for (FileRange part : ranges) {
            if (part.firstIndex != expected) {
                throw new LogFilesException("entries " + expected + ".." + (part.firstIndex - 1)
                        + " are missing from the files");
            }
            expected = part.lastIndex + 1;
        }
        if (expected != lastIndex + 1) {
            throw new LogFilesException("entries " + expected + ".." + lastIndex + " are committed but not in the files");
        }
    }
}
