package io.pydledger.spark;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.zip.CRC32;

import com.fasterxml.jackson.core.json.JsonReadFeature;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.json.JsonMapper;

import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The committed entries of one FileRange as ColumnarBatches, filled straight
 * from the segment file: the walk of spark/entry_scan.py (every check, both
 * CRCs, the same errors) and the rows of spark/row_builder.py (the reference
 * decoder), only for the columns the query reads. Or those of a LiveRange,
 * from the raw runs a running group's nodes send (LiveRuns): the same checks
 * and rows, a run at a time; a run that fails a check is read again from
 * another node.
 */
final class RangeReader implements PartitionReader<ColumnarBatch> {
    static final int BATCH_ROWS = 4096;
    static final long BATCH_BYTES = 32L << 20;
    static final int CHUNK_BYTES = 8 << 20;
    static final int CHANNEL_STATE_MACHINE = 1;
    static final int MESSAGE_MAGIC_CODE = -626843481, MESSAGE_MAGIC_CODE_V2 = -626843477;
    static final int SYSTEM_MAGIC_CODE = 0x53595345;
    static final int BORNHOST_V6_FLAG = 1 << 4, STOREHOSTADDRESS_V6_FLAG = 1 << 5;
    static final int V6_BITS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG;
    static final int FIXED_V4 = 88;  // TOTALSIZE .. body length with IPv4 hosts
    static final int MIN_MESSAGE_SIZE = 91;
    static final byte[] KIND_MESSAGE = bytes("message"), KIND_SYSTEM = bytes("system"), KIND_RAW = bytes("raw");
    static final byte[] TAGS = bytes("TAGS"), KEYS = bytes("KEYS"), UNIQ_KEY = bytes("UNIQ_KEY");
    static final int[] CRC_TABLE = new int[256];
    private static final ObjectMapper JSON = JsonMapper.builder()
            .enable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS)
            .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS).build();

    static {
        for (int n = 0; n < 256; n++) {
            int c = n;
            for (int k = 0; k < 8; k++) {
                c = (c & 1) != 0 ? 0xEDB88320 ^ (c >>> 1) : c >>> 1;
            }
            CRC_TABLE[n] = c;
        }
    }

    private final String where;  // the segment's path, or the group: for errors
    private final long base;  // the segment's start (files); 0 for runs, whose positions are absolute
    private final long firstIndex;
    private final long lastIndex;
    private final FileRange part;  // null when reading live
    private final LiveRuns live;  // null when reading files
    private final Set<String> topics;
    private final int[] slot = new int[Columns.COUNT];  // column -> vector, or -1
    private final OnHeapColumnVector[] vectors;
    private final ColumnarBatch batch;
    private final RandomAccessFile file;
    private final FileChannel channel;
    private final CRC32 crc = new CRC32();
    private final Map<String, Long> tagCodes = new HashMap<>();

    private byte[] chunk = new byte[0];
    private int chunkLength;
    private int at;
    private long relative;  // the chunk's offset in the segment
    private long expected;
    private long chain;  // -1: the entry before is not at hand
    private boolean started;

    // The message being decoded: its fields and where its pieces are in `chunk`.
    private int mQueueId, mSysFlag, mBodyStart, mBodyLength, mTopicStart, mTopicLength, mTextStart, mTextLength;
    private long mQueueOffset, mBorn, mStored;
    private Map<String, String> mStrict;  // properties as the strict codec read them (null: split the text)

    RangeReader(FileRange part, StructType schema, Set<String> topics) throws IOException {
        this(part.path, part.segmentStart, part.firstIndex, part.lastIndex, part.previousChainCrc, part, null, schema,
                topics);
    }

    RangeReader(LiveRange range, StructType schema, Set<String> topics) throws IOException {
        this("group " + range.group, 0, range.firstIndex, range.lastIndex, -1, null, new LiveRuns(range), schema,
                topics);
    }

    private RangeReader(String where, long base, long firstIndex, long lastIndex, long chain, FileRange part,
                        LiveRuns live, StructType schema, Set<String> topics) throws IOException {
        this.where = where;
        this.base = base;
        this.firstIndex = firstIndex;
        this.lastIndex = lastIndex;
        this.part = part;
        this.live = live;
        this.topics = topics;
        java.util.Arrays.fill(slot, -1);
        StructField[] fields = schema.fields();
        for (int k = 0; k < fields.length; k++) {
            slot[Columns.position(fields[k].name())] = k;
        }
        vectors = OnHeapColumnVector.allocateColumns(BATCH_ROWS, schema);
        batch = new ColumnarBatch(vectors);
        file = part == null ? null : new RandomAccessFile(part.path, "r");
        channel = file == null ? null : file.getChannel();
        expected = firstIndex;
        this.chain = chain;
    }

    private static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    @Override
    public boolean next() throws IOException {
        if (!started) {
            started = true;
            if (live != null) {
                nextRun();
            } else {
                relative = (part.pos >= 0 ? part.pos : firstPos()) - part.segmentStart;
                fill();
            }
        }
        for (OnHeapColumnVector v : vectors) {
            v.reset();
        }
        int rows = 0;
        long bytes = 0;
        while (expected <= lastIndex && rows < BATCH_ROWS && bytes < BATCH_BYTES) {
            if (at + LogFiles.HEADER_SIZE > chunkLength) {
                advance(-1);
                continue;
            }
            byte[] b = chunk;
            int magic = LogFiles.int32(b, at), size = LogFiles.int32(b, at + 4), bodySize = LogFiles.int32(b, at + 44);
            if (!LogFiles.validMagic(magic) || size != LogFiles.HEADER_SIZE + bodySize || bodySize < 0) {
                reject(expected, relative + at, "no entry header (magic " + magic + ", size " + size + ")");
                continue;
            }
            if (at + size > chunkLength) {
                advance(size);
                continue;
            }
            long index = LogFiles.int64(b, at + 8), pos = LogFiles.int64(b, at + 24);
            if (index != expected || pos != base + relative + at) {
                reject(expected, relative + at, "found entry " + index + " claiming pos " + pos);
                continue;
            }
            int body = at + LogFiles.HEADER_SIZE;
            crc.reset();
            crc.update(b, body, bodySize);
            if (crc.getValue() != (LogFiles.int32(b, at + 40) & 0xffffffffL)) {
                reject(index, relative + at, "body CRC mismatch");
                continue;
            }
            long stored = LogFiles.int32(b, at + 36) & 0xffffffffL;
            if (chain >= 0 && chainCrc(b, at, chain) != stored) {
                reject(index, relative + at, "chain CRC mismatch: it does not follow the entry before");
                continue;
            }
            chain = stored;
            if (magic == LogFiles.MAGIC_NORMAL) {
                long term = LogFiles.int64(b, at + 16);
                boolean machine = LogFiles.int32(b, at + 32) == CHANNEL_STATE_MACHINE;
                if (row(rows, index, term, pos, body, bodySize, machine)) {
                    rows++;
                    bytes += bodySize;
                }
            }
            expected++;
            at += size;
        }
        batch.setNumRows(rows);
        return rows > 0 || expected <= lastIndex;
    }

    /**
     * A failed check at entry `index`: the error, for a file; for a run, the
     * run is read again from the next node (LiveRuns.refuse), and the walk
     * goes on with what that node sends.
     */
    private void reject(long index, long offset, String what) throws IOException {
        LogFilesException error = damaged(index, offset, what);
        if (live == null) {
            throw error;
        }
        live.refuse(expected, error.getMessage());
        chunkLength = at = 0;
    }

    /** The next run into `chunk` (LiveRuns); at the range's end, the walk is done. */
    private void nextRun() throws IOException {
        LiveRuns.Run run = live.next();
        if (run == null) {
            expected = lastIndex + 1;
            chunkLength = at = 0;
            return;
        }
        chunk = run.data;
        at = run.offset;
        chunkLength = run.offset + run.length;
        relative = run.firstPos - run.offset;
        if (run.firstIndex != expected) {
            // Entries left out before this run (a reader who may not see users'
            // secrets): the run's first link cannot be checked.
            expected = run.firstIndex;
            chain = -1;
        }
    }

    /**
     * The next piece of the segment, from the entry at `at` on (size: that
     * entry's, -1 when its header is cut). Reading runs: the next run, once
     * this one is walked to its end (a run holds whole entries only).
     */
    private void advance(int size) throws IOException {
        if (live != null) {
            if (at < chunkLength) {
                reject(expected, relative + at, size < 0 ? "a run ends inside an entry header"
                        : "a run ends inside an entry");
            } else {
                nextRun();
            }
            return;
        }
        if (at == 0) {
            if (size < 0) {
                throw damaged(expected, relative, "the segment ends before the committed entries do");
            }
            long remaining = part.segmentSize - relative;
            if (chunkLength >= remaining) {
                throw damaged(expected, relative, "entry of " + size + " bytes runs past the segment");
            }
            chunk = new byte[(int) Math.min(remaining, Math.max(2L * chunk.length, size))];  // larger than a chunk
        }
        relative += at;
        fill();
    }

    private void fill() throws IOException {
        int want = (int) Math.max(0, Math.min(Math.max(CHUNK_BYTES, chunk.length), part.segmentSize - relative));
        if (chunk.length < want) {
            chunk = new byte[want];
        }
        ByteBuffer buffer = ByteBuffer.wrap(chunk, 0, want);
        while (buffer.hasRemaining()) {
            if (channel.read(buffer, relative + buffer.position()) < 0) {
                break;
            }
        }
        chunkLength = buffer.position();
        at = 0;
    }

    private long firstPos() {
        long at = 0;
        while (at + LogFiles.HEADER_SIZE <= part.segmentSize) {
            byte[] h = LogFiles.pread(part.path, at, LogFiles.HEADER_SIZE);
            if (h.length < LogFiles.HEADER_SIZE) {
                break;
            }
            int magic = LogFiles.int32(h, 0), size = LogFiles.int32(h, 4);
            if (magic == LogFiles.MAGIC_BLANK && at == 0) {
                at = size;
                continue;
            }
            if (!LogFiles.validMagic(magic)) {
                break;
            }
            long index = LogFiles.int64(h, 8);
            if (index == part.firstIndex) {
                return part.segmentStart + at;
            }
            if (index > part.firstIndex) {
                break;
            }
            at += size;
        }
        throw new LogFilesException(part.path + ": entry " + part.firstIndex + " is not in this segment");
    }

    private LogFilesException damaged(long index, long offset, String what) {
        return new LogFilesException(where + " at " + (live == null ? "offset " : "pos ") + offset + ", entry " + index
                + ": " + what);
    }

    /** zlib's crc32(header[40:44], crc32(header[0:36], seed)): the chain CRC. */
    static long chainCrc(byte[] b, int at, long seed) {
        int c = ~(int) seed;
        for (int k = at; k < at + 36; k++) {
            c = CRC_TABLE[(c ^ b[k]) & 0xff] ^ (c >>> 8);
        }
        for (int k = at + 40; k < at + 44; k++) {
            c = CRC_TABLE[(c ^ b[k]) & 0xff] ^ (c >>> 8);
        }
        return ~c & 0xffffffffL;
    }

    // ------------------------------------------------------------ rows

    /** Decode one NORMAL entry's body into row `r`; false when the entry makes no row (topic filter). */
    private boolean row(int r, long index, long term, long pos, int body, int n, boolean machine) {
        byte[] b = chunk;
        int magic = machine && n >= 8 ? LogFiles.int32(b, body + 4) : 0;
        if (magic == MESSAGE_MAGIC_CODE || magic == MESSAGE_MAGIC_CODE_V2) {
            int count = message(b, body, n);
            if (count >= 0) {
                if (topics != null && !topics.contains(new String(b, mTopicStart, mTopicLength, StandardCharsets.UTF_8))) {
                    return false;
                }
                writeMessage(r, index, term, pos, b, n, count);
                return true;
            }
        } else if (magic == SYSTEM_MAGIC_CODE) {
            String kind = systemKind(b, body, n);
            if (kind != null) {
                if (topics != null) {
                    return false;
                }
                writeOther(r, index, term, pos, KIND_SYSTEM, b, body + 10, n - 10, n, kind);
                return true;
            }
        }
        if (topics != null) {
            return false;  // a topic filter keeps messages of those topics only
        }
        writeOther(r, index, term, pos, KIND_RAW, b, body, n, n, null);
        return true;
    }

    /**
     * The record as row_builder.parse_message reads it: its IPv4 fast path
     * (the properties text as it is), else store.codec.peek (the strict
     * codec). Returns how many properties, or -1 when the reference would
     * make a raw row of it.
     */
    private int message(byte[] b, int s, int n) {
        mStrict = null;
        int sysFlag = n >= 40 ? LogFiles.int32(b, s + 36) : 0;
        if (n >= FIXED_V4 && (sysFlag & V6_BITS) == 0) {
            int v4 = messageV4(b, s, n);
            if (v4 != -2) {
                return v4;
            }
        }
        return messageStrict(b, s, n);
    }

    /** _parse_v4 then _property_count; -2 when _parse_v4 declines (peek decides then). */
    private int messageV4(byte[] b, int s, int n) {
        if (LogFiles.int32(b, s) != n) {
            return -2;
        }
        int bodyLength = LogFiles.int32(b, s + 84);
        long bodyEnd = FIXED_V4 + (long) bodyLength;
        if (bodyLength < 0 || bodyEnd + 3 > n) {
            return -2;
        }
        boolean v1 = LogFiles.int32(b, s + 4) == MESSAGE_MAGIC_CODE;
        int topicStart, topicEnd;
        if (v1) {
            topicStart = (int) bodyEnd + 1;
            topicEnd = topicStart + (b[s + (int) bodyEnd] & 0xff);
        } else {
            topicStart = (int) bodyEnd + 2;
            topicEnd = topicStart + (((b[s + (int) bodyEnd] & 0xff) << 8) | (b[s + (int) bodyEnd + 1] & 0xff));
        }
        if (topicEnd + 2 > n || topicEnd == topicStart || topicEnd + 2 + short16(b, s + topicEnd) != n) {
            return -2;
        }
        if (!utf8(b, s + topicStart, topicEnd - topicStart) || !utf8(b, s + topicEnd + 2, n - topicEnd - 2)) {
            return -2;
        }
        fixed(b, s, 48 + 8, bodyLength);
        mBodyStart = s + FIXED_V4;
        mTopicStart = s + topicStart;
        mTopicLength = topicEnd - topicStart;
        mTextStart = s + topicEnd + 2;
        mTextLength = n - topicEnd - 2;
        return propertyCount(b, mTextStart, mTextLength);
    }

    private void fixed(byte[] b, int s, int storeAt, int bodyLength) {
        mQueueId = LogFiles.int32(b, s + 12);
        mQueueOffset = LogFiles.int64(b, s + 20);
        mSysFlag = LogFiles.int32(b, s + 36);
        mBorn = LogFiles.int64(b, s + 40);
        mStored = LogFiles.int64(b, s + storeAt);
        mBodyLength = bodyLength;
    }

    /** row_builder._property_count: pairs, or -1 when the text is malformed. */
    private static int propertyCount(byte[] b, int start, int length) {
        if (length == 0) {
            return 0;
        }
        int pairs = 0, separators = 0;
        for (int k = start; k < start + length; k++) {
            if (b[k] == 1) {
                pairs++;
            } else if (b[k] == 2) {
                separators++;
            }
        }
        if (separators != pairs && !(separators == pairs - 1 && b[start + length - 1] != 2)) {
            return -1;
        }
        return pairs;
    }

    /** store.codec.peek (_parse and decode_properties), then parse_message's count. */
    private int messageStrict(byte[] b, int s, int n) {
        if (n < 8) {
            return -1;
        }
        int total = LogFiles.int32(b, s);
        if (total < MIN_MESSAGE_SIZE || total != n) {
            return -1;
        }
        int sysFlag = LogFiles.int32(b, s + 36);
        int born = (sysFlag & BORNHOST_V6_FLAG) != 0 ? 16 : 4, store = (sysFlag & STOREHOSTADDRESS_V6_FLAG) != 0 ? 16 : 4;
        int storeAt = 48 + born + 4;
        int bodyStart = storeAt + 8 + store + 4 + 4 + 8 + 4;
        if (bodyStart > n) {
            return -1;
        }
        int bodyLength = LogFiles.int32(b, s + bodyStart - 4);
        long lengthAt = bodyStart + (long) bodyLength;
        boolean v1 = LogFiles.int32(b, s + 4) == MESSAGE_MAGIC_CODE;
        long topicStart = lengthAt + (v1 ? 1 : 2);
        if (bodyLength < 0 || topicStart > n) {
            return -1;
        }
        int topicLength = v1 ? b[s + (int) lengthAt] & 0xff
                : ((b[s + (int) lengthAt] & 0xff) << 8) | (b[s + (int) lengthAt + 1] & 0xff);
        long propertiesStart = topicStart + topicLength + 2;
        if (propertiesStart > n) {
            return -1;
        }
        int propertiesLength = short16(b, s + (int) propertiesStart - 2);
        if (propertiesStart + propertiesLength != n || topicLength == 0) {
            return -1;
        }
        Map<String, String> properties = new LinkedHashMap<>();
        if (n > propertiesStart) {
            String text = decode(b, s + (int) propertiesStart, n - (int) propertiesStart);
            if (text == null) {
                return -1;
            }
            if (text.endsWith("\u0002")) {
                text = text.substring(0, text.length() - 1);
            }
            for (String item : text.split("\u0002", -1)) {
                int cut = item.indexOf('\u0001');
                if (cut < 0) {
                    return -1;
                }
                properties.put(item.substring(0, cut), item.substring(cut + 1));
            }
            if (properties.containsKey("")) {
                return -1;
            }
        }
        if (decode(b, s + (int) topicStart, topicLength) == null) {
            return -1;
        }
        for (String value : properties.values()) {
            if (value.indexOf('\u0001') >= 0) {
                return -1;  // the text parse_message joins would be malformed (_property_count)
            }
        }
        fixed(b, s, storeAt, bodyLength);
        mBodyStart = s + bodyStart;
        mTopicStart = s + (int) topicStart;
        mTopicLength = topicLength;
        mStrict = properties;
        return properties.size();
    }

    private static int short16(byte[] b, int at) {
        return (short) (((b[at] & 0xff) << 8) | (b[at + 1] & 0xff));
    }

    private static boolean utf8(byte[] b, int start, int length) {
        for (int k = start; k < start + length; k++) {
            if (b[k] < 0) {
                return decode(b, start, length) != null;
            }
        }
        return true;
    }

    /** The bytes as text, or null when they are not UTF-8 (as Python's strict codec). */
    private static String decode(byte[] b, int start, int length) {
        CharsetDecoder decoder = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                .onUnmappableCharacter(CodingErrorAction.REPORT);
        try {
            CharBuffer chars = decoder.decode(ByteBuffer.wrap(b, start, length));
            return chars.toString();
        } catch (CharacterCodingException error) {
            return null;
        }
    }

    /** store.system_entry.decode_system_entry: the kind's name, or null when it is no system entry. */
    private static String systemKind(byte[] b, int s, int n) {
        if (n < 10 || LogFiles.int32(b, s) != n) {
            return null;
        }
        int kind = short16(b, s + 8);
        String text = decode(b, s + 10, n - 10);
        if (text == null) {
            return null;
        }
        try {
            JsonNode node = JSON.readTree(text);
            if (node == null || !node.isObject()) {
                return null;
            }
        } catch (IOException | RuntimeException error) {
            return null;
        }
        switch (kind) {
            case 1: return "TOPIC_UPDATE";
            case 2: return "TOPIC_DELETE";
            case 3: return "GROUP_UPDATE";
            case 4: return "GROUP_DELETE";
            case 5: return "CONSUMER_OFFSETS";
            case 6: return "METADATA_SNAPSHOT";
            case 100: return "BROKER_BASE";
            default: return kind >= 100 ? "BROKER_" + kind : "KIND_" + kind;
        }
    }

    // ------------------------------------------------------------ writing

    private WritableColumnVector column(int c) {
        int k = slot[c];
        return k < 0 ? null : vectors[k];
    }

    private void writeOther(int r, long index, long term, long pos, byte[] kind, byte[] b, int payload, int length,
                            int size, String systemKind) {
        WritableColumnVector v;
        common(r, index, term, pos, kind, size);
        for (int c : new int[] {Columns.TOPIC, Columns.QUEUE_ID, Columns.QUEUE_OFFSET, Columns.MESSAGE_ID, Columns.KEYS,
                Columns.TAGS, Columns.PROPERTIES, Columns.BORN_TIMESTAMP, Columns.STORE_TIMESTAMP, Columns.SYS_FLAG,
                Columns.TAGS_CODE}) {
            if ((v = column(c)) != null) {
                v.putNull(r);
            }
        }
        if ((v = column(Columns.BODY)) != null) {
            v.putByteArray(r, b, payload, length);
        }
        if ((v = column(Columns.SYSTEM_KIND)) != null) {
            if (systemKind == null) {
                v.putNull(r);
            } else {
                byte[] name = bytes(systemKind);
                v.putByteArray(r, name, 0, name.length);
            }
        }
    }

    private void common(int r, long index, long term, long pos, byte[] kind, int size) {
        WritableColumnVector v;
        if ((v = column(Columns.INDEX)) != null) {
            v.putLong(r, index);
        }
        if ((v = column(Columns.TERM)) != null) {
            v.putLong(r, term);
        }
        if ((v = column(Columns.KIND)) != null) {
            v.putByteArray(r, kind, 0, kind.length);
        }
        if ((v = column(Columns.PHYSICAL_OFFSET)) != null) {
            v.putLong(r, pos + 48);
        }
        if ((v = column(Columns.STORE_SIZE)) != null) {
            v.putInt(r, size);
        }
    }

    private void writeMessage(int r, long index, long term, long pos, byte[] b, int n, int count) {
        WritableColumnVector v;
        common(r, index, term, pos, KIND_MESSAGE, n);
        if ((v = column(Columns.TOPIC)) != null) {
            v.putByteArray(r, b, mTopicStart, mTopicLength);
        }
        if ((v = column(Columns.QUEUE_ID)) != null) {
            v.putInt(r, mQueueId);
        }
        if ((v = column(Columns.QUEUE_OFFSET)) != null) {
            v.putLong(r, mQueueOffset);
        }
        if ((v = column(Columns.BORN_TIMESTAMP)) != null) {
            v.putLong(r, mBorn * 1000);
        }
        if ((v = column(Columns.STORE_TIMESTAMP)) != null) {
            v.putLong(r, mStored * 1000);
        }
        if ((v = column(Columns.BODY)) != null) {
            v.putByteArray(r, b, mBodyStart, mBodyLength);
        }
        if ((v = column(Columns.SYS_FLAG)) != null) {
            v.putInt(r, mSysFlag);
        }
        if ((v = column(Columns.SYSTEM_KIND)) != null) {
            v.putNull(r);
        }
        WritableColumnVector properties = column(Columns.PROPERTIES), tags = column(Columns.TAGS),
                keys = column(Columns.KEYS), messageId = column(Columns.MESSAGE_ID), tagsCode = column(Columns.TAGS_CODE);
        if (properties == null && tags == null && keys == null && messageId == null && tagsCode == null) {
            return;
        }
        // name/value pairs as (start, length) in b, or strings from the strict codec
        int[] parts = null;
        byte[][] strict = null;
        if (mStrict != null) {
            strict = new byte[2 * mStrict.size()][];
            int k = 0;
            for (Map.Entry<String, String> e : mStrict.entrySet()) {
                strict[k++] = bytes(e.getKey());
                strict[k++] = bytes(e.getValue());
            }
            parts = new int[4 * mStrict.size()];
            int offset = 0;
            for (int j = 0; j < strict.length; j++) {
                parts[2 * j] = offset;  // into `flat`
                parts[2 * j + 1] = strict[j].length;
                offset += strict[j].length;
            }
            byte[] flat = new byte[offset];
            for (int j = 0; j < strict.length; j++) {
                System.arraycopy(strict[j], 0, flat, parts[2 * j], strict[j].length);
            }
            b = flat;
        } else {
            parts = splitText(b, mTextStart, mTextLength, count);
        }
        int pairs = count;
        if (properties != null) {
            WritableColumnVector names = properties.getChild(0), values = properties.getChild(1);
            int first = names.getElementsAppended();
            for (int p = 0; p < pairs; p++) {
                names.appendByteArray(b, parts[4 * p], parts[4 * p + 1]);
                values.appendByteArray(b, parts[4 * p + 2], parts[4 * p + 3]);
            }
            properties.putArray(r, first, pairs);
        }
        int tag = lookup(b, parts, pairs, TAGS);
        if (tags != null) {
            putOrNull(tags, r, b, parts, tag);
        }
        if (messageId != null) {
            putOrNull(messageId, r, b, parts, lookup(b, parts, pairs, UNIQ_KEY));
        }
        if (keys != null) {
            int key = lookup(b, parts, pairs, KEYS);
            if (key < 0) {
                keys.putNull(r);
            } else {
                WritableColumnVector items = keys.arrayData();
                int first = items.getElementsAppended(), start = parts[4 * key + 2], end = start + parts[4 * key + 3];
                int from = start;
                for (int k = start; k <= end; k++) {
                    if (k == end || b[k] == ' ') {
                        if (k > from) {
                            items.appendByteArray(b, from, k - from);
                        }
                        from = k + 1;
                    }
                }
                keys.putArray(r, first, items.getElementsAppended() - first);
            }
        }
        if (tagsCode != null) {
            long code = 0;
            if (tag >= 0 && parts[4 * tag + 3] > 0) {
                String text = new String(b, parts[4 * tag + 2], parts[4 * tag + 3], StandardCharsets.UTF_8);
                Long cached = tagCodes.get(text);
                if (cached == null) {
                    cached = (long) text.hashCode();
                    tagCodes.put(text, cached);
                }
                code = cached;
            }
            tagsCode.putLong(r, code);
        }
    }

    private static void putOrNull(WritableColumnVector v, int r, byte[] b, int[] parts, int pair) {
        if (pair < 0) {
            v.putNull(r);
        } else {
            v.putByteArray(r, b, parts[4 * pair + 2], parts[4 * pair + 3]);
        }
    }

    /** The first pair named `name`, or -1. */
    private static int lookup(byte[] b, int[] parts, int pairs, byte[] name) {
        for (int p = 0; p < pairs; p++) {
            if (parts[4 * p + 1] == name.length) {
                int start = parts[4 * p];
                boolean same = true;
                for (int k = 0; k < name.length && same; k++) {
                    same = b[start + k] == name[k];
                }
                if (same) {
                    return p;
                }
            }
        }
        return -1;
    }

    /**
     * The reference's split of a properties text (a trailing \x02 cut off,
     * then every \x01 and \x02 a separator, parts taken as name, value, ...):
     * (name start, name length, value start, value length) per pair.
     */
    private static int[] splitText(byte[] b, int start, int length, int pairs) {
        int[] parts = new int[4 * pairs];
        if (pairs == 0) {
            return parts;
        }
        int end = start + length;
        if (b[end - 1] == 2) {
            end--;
        }
        int k = 0, from = start;
        for (int at = start; at <= end && k < 2 * pairs; at++) {
            if (at == end || b[at] == 1 || b[at] == 2) {
                parts[2 * k] = from;
                parts[2 * k + 1] = at - from;
                k++;
                from = at + 1;
            }
        }
        for (; k < 2 * pairs; k++) {  // a malformed text the reference misaligns: empty values here
            parts[2 * k] = end;
            parts[2 * k + 1] = 0;
        }
        return parts;
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() throws IOException {
        batch.close();
        if (file != null) {
            file.close();
        }
        if (live != null) {
            live.close();
        }
    }
}
