package io.pydledger.spark;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;

/**
 * The few fields of proto/dledger.proto the JVM live reader sends and reads,
 * in protobuf's wire format by hand: the Spark image has no protobuf
 * runtime for our messages, and a reader needs only varints and
 * length-delimited fields. Unknown fields are skipped, as protobuf does.
 */
final class Proto {
    static final int VARINT = 0, FIXED64 = 1, LENGTH = 2, FIXED32 = 5;

    private Proto() {
    }

    /** A message being written, field by field. */
    static final class Writer {
        private final ByteArrayOutputStream out = new ByteArrayOutputStream();

        Writer int64(int field, long value) {
            if (value != 0) {
                varint(((long) field << 3) | VARINT);
                varint(value);
            }
            return this;
        }

        Writer bool(int field, boolean value) {
            return int64(field, value ? 1 : 0);
        }

        Writer string(int field, String value) {
            return bytes(field, value.getBytes(StandardCharsets.UTF_8));
        }

        Writer bytes(int field, byte[] value) {
            if (value.length > 0) {
                varint(((long) field << 3) | LENGTH);
                varint(value.length);
                out.write(value, 0, value.length);
            }
            return this;
        }

        byte[] done() {
            return out.toByteArray();
        }

        private void varint(long value) {
            while ((value & ~0x7FL) != 0) {
                out.write((int) ((value & 0x7F) | 0x80));
                value >>>= 7;
            }
            out.write((int) value);
        }
    }

    /** A message being read: next() moves to a field, then one of the readers takes its value. */
    static final class Reader {
        final byte[] b;
        private int at;
        private final int end;
        private int field, wire;
        /** The last length-delimited value's place in b. */
        int start, length;

        Reader(byte[] b) {
            this(b, 0, b.length);
        }

        Reader(byte[] b, int start, int length) {
            this.b = b;
            this.at = start;
            this.end = start + length;
        }

        boolean next() {
            if (at >= end) {
                return false;
            }
            long tag = varint();
            field = (int) (tag >>> 3);
            wire = (int) (tag & 7);
            return true;
        }

        int field() {
            return field;
        }

        long int64() {
            return varint();
        }

        boolean bool() {
            return varint() != 0;
        }

        /** The value's bytes stay in b, at [start, start + length). */
        Reader delimited() {
            long n = varint();
            if (n < 0 || n > end - at) {
                throw new IllegalStateException("a protobuf field runs past its message");
            }
            start = at;
            length = (int) n;
            at += length;
            return this;
        }

        String string() {
            delimited();
            return new String(b, start, length, StandardCharsets.UTF_8);
        }

        Reader message() {
            delimited();
            return new Reader(b, start, length);
        }

        void skip() {
            switch (wire) {
                case VARINT:
                    varint();
                    break;
                case FIXED64:
                    at += 8;
                    break;
                case LENGTH:
                    delimited();
                    break;
                case FIXED32:
                    at += 4;
                    break;
                default:
                    throw new IllegalStateException("protobuf wire type " + wire + " is not one proto3 writes");
            }
        }

        private long varint() {
            long value = 0;
            for (int shift = 0; shift < 64; shift += 7) {
                if (at >= end) {
                    throw new IllegalStateException("a protobuf varint runs past its message");
                }
                byte next = b[at++];
                value |= (long) (next & 0x7F) << shift;
                if (next >= 0) {
                    return value;
                }
            }
            throw new IllegalStateException("a protobuf varint longer than 10 bytes");
        }
    }

    /** A response Header's outcome (dledger.v1.Header: code 4, message 7, leader_address 8). */
    static final class Outcome {
        int code = 200;
        String message = "";
        String leaderAddress = "";

        static Outcome of(Reader header) {
            Outcome o = new Outcome();
            while (header.next()) {
                switch (header.field()) {
                    case 4:
                        o.code = (int) header.int64();
                        break;
                    case 7:
                        o.message = header.string();
                        break;
                    case 8:
                        o.leaderAddress = header.string();
                        break;
                    default:
                        header.skip();
                }
            }
            return o;
        }
    }

    /** dledger.v1.Header with only the group set. */
    static byte[] header(String group) {
        return new Writer().string(1, group).done();
    }
}
