package io.pydledger.spark;

import java.io.Closeable;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The raw runs of one LiveRange, as spark/live_log.py's _RangeReader reads
 * them: a committed range read (`ReadRequest.raw`) from the partition's
 * replicas in order, then from the leader, resuming after the last run
 * handed out whenever a node fails. A replica behind the pinned end answers
 * INDEX_OUT_OF_RANGE and is asked again for up to REPLICA_WAIT_MS; a
 * replica that does not answer within REPLICA_DEADLINE_MS, or whose run
 * fails the reader's checks ({@link #refuse}), is left for the next node.
 * The leader is found by asking the group (and followed on NOT_LEADER) until
 * LEADER_DEADLINE_MS pass without progress. maxBytesPerSecond throttles.
 * With liveTransport=auto and no TLS or credentials, a node's runs come
 * from its HTTP port ({@link RawHttp}: sent from its files) where it offers
 * them; from gRPC otherwise. The messages, and so every check, are the same.
 */
final class LiveRuns implements Closeable {
    static final int RUN_BYTES = 1 << 20;  // a node reads a run on its event loop: runs stay small
    static final int INDEX_RECORD_SIZE = 32;
    static final long REPLICA_WAIT_MS = 2_000, REPLICA_DEADLINE_MS = 2_000, LEADER_DEADLINE_MS = 10_000;

    /** Entries firstIndex..lastIndex, back to back in data[offset, offset + length), the first at firstPos. */
    static final class Run {
        byte[] data;
        int offset, length;
        long firstIndex, lastIndex, firstPos;
    }

    private final LiveRange part;
    private final List<String> sources = new ArrayList<>();  // null: the leader, wherever it is
    private final List<String> failures = new ArrayList<>();
    private long nextIndex;
    private Grpc.Connection connection;
    private Grpc.Call call;
    private RawHttp raw;  // instead of call, when the node serves runs over HTTP
    private final Map<String, HttpPort> httpOf = new HashMap<>();  // gRPC address -> its HTTP port, NONE: gRPC
    private String target;
    private String leaderHint;
    private long started;
    private final long begun;
    private long bytes;

    LiveRuns(LiveRange part) {
        this.part = part;
        sources.addAll(part.replicas);
        sources.add(null);
        nextIndex = part.firstIndex;
        started = begun = System.currentTimeMillis();
    }

    /** The next run of the range; null past its end. */
    Run next() throws IOException {
        while (nextIndex <= part.lastIndex) {
            if (call == null && raw == null && !open()) {
                continue;
            }
            byte[] message;
            try {
                long deadline = sources.get(0) == null ? LEADER_DEADLINE_MS : REPLICA_DEADLINE_MS;
                message = raw != null ? raw.next(deadline) : call.next(deadline);
            } catch (Grpc.Failure failure) {
                failed(failure);
                continue;
            }
            if (message == null) {
                // The node served the whole range: it refuses a range above
                // its committed index up front, and ends only at the range's end.
                drop();
                nextIndex = part.lastIndex + 1;
                return null;
            }
            Run run = run(message);
            if (run != null) {
                started = System.currentTimeMillis();  // progress
                throttle(run.length);
                return run;
            }
        }
        return null;
    }

    /** The run starting at `index` failed a check: read it again from the next node. */
    void refuse(long index, String why) throws IOException {
        drop();
        nextIndex = index;
        if (sources.get(0) == null) {
            throw new IOException(why + " (read from the leader " + target + ")");
        }
        failOver(why);
    }

    /** A response's run, or null after handling its error. */
    private Run run(byte[] message) throws IOException {
        Proto.Reader r = new Proto.Reader(message);
        Proto.Outcome outcome = new Proto.Outcome();
        int recordsAt = 0, recordsLength = 0, dataAt = 0, dataLength = 0;
        while (r.next()) {
            switch (r.field()) {
                case 1:
                    outcome = Proto.Outcome.of(r.message());
                    break;
                case 5:
                    r.delimited();
                    recordsAt = r.start;
                    recordsLength = r.length;
                    break;
                case 6:
                    r.delimited();
                    dataAt = r.start;
                    dataLength = r.length;
                    break;
                default:
                    r.skip();
            }
        }
        if (outcome.code != LiveGroup.SUCCESS) {
            failed(outcome.code, target + ": code " + outcome.code + ": " + outcome.message, outcome.leaderAddress);
            return null;
        }
        String wrong = check(message, recordsAt, recordsLength, dataLength);
        if (wrong != null) {
            failed(0, target + ": " + wrong, "");
            return null;
        }
        Run run = new Run();
        run.data = message;
        run.offset = dataAt;
        run.length = dataLength;
        run.firstIndex = LogFiles.int64(message, recordsAt + 16);
        run.lastIndex = LogFiles.int64(message, recordsAt + recordsLength - INDEX_RECORD_SIZE + 16);
        run.firstPos = LogFiles.int64(message, recordsAt + 4);
        nextIndex = run.lastIndex + 1;
        return run;
    }

    /** What is wrong with a run's index records (magic, pos, size, index, term each), or null. */
    private String check(byte[] b, int at, int length, int dataLength) {
        if (length < INDEX_RECORD_SIZE || length % INDEX_RECORD_SIZE != 0) {
            return "a raw read answered " + length + " bytes of index records";
        }
        long first = LogFiles.int64(b, at + 16), pos = LogFiles.int64(b, at + 4), total = 0;
        for (int k = 0; k < length / INDEX_RECORD_SIZE; k++) {
            int record = at + k * INDEX_RECORD_SIZE;
            if (LogFiles.int64(b, record + 16) != first + k || LogFiles.int64(b, record + 4) != pos + total) {
                return "a raw read answered index records that are not one run";
            }
            total += LogFiles.int32(b, record + 12);
        }
        long last = first + length / INDEX_RECORD_SIZE - 1;
        if (first < nextIndex || last > part.lastIndex) {
            return "a raw read answered entries " + first + ".." + last + " when " + nextIndex + ".."
                    + part.lastIndex + " were asked for";
        }
        if (total != dataLength) {
            return "a raw read answered " + dataLength + " bytes for entries of " + total;
        }
        return null;
    }

    /** Opens the read at nextIndex on the current source; false after handling a failure. */
    private boolean open() throws IOException {
        String source = sources.get(0);
        target = source != null ? source : leaderHint != null ? leaderHint : leader();
        leaderHint = null;
        if (target == null) {
            failed(0, "no node answers as the leader of group '" + part.group + "'", "");
            return false;
        }
        long deadline = source == null ? LEADER_DEADLINE_MS / 4 : REPLICA_DEADLINE_MS;
        HttpPort http = httpPort(target);
        if (http != null) {
            try {
                raw = RawHttp.open(http.address, http.nodeId, part.group, nextIndex, part.lastIndex, RUN_BYTES,
                        deadline);
                return true;
            } catch (RawHttp.Unavailable unavailable) {
                httpOf.put(target, HttpPort.NONE);  // read this node over gRPC from now on
            }
        }
        byte[] request = new Proto.Writer().bytes(1, Proto.header(part.group)).int64(2, nextIndex)
                .int64(3, part.lastIndex).int64(4, RUN_BYTES).bool(6, source == null).bool(7, true).done();
        try {
            connection = Grpc.Connection.open(target, part.access, deadline);
            call = connection.call(LiveGroup.SERVICE + "Read", request, 0);
            return true;
        } catch (Grpc.Failure failure) {
            failed(failure);
            return false;
        }
    }

    /** A node's HTTP port for raw runs, and the id that must answer there. */
    private record HttpPort(String address, String nodeId) {
        static final HttpPort NONE = new HttpPort("", "");
    }

    /** Where `node` serves runs over HTTP, or null: not offered, not wanted, or not known yet. */
    private HttpPort httpPort(String node) throws IOException {
        if (!part.rawHttp || !part.access.tlsCa().isEmpty() || !part.access.user().isEmpty()) {
            return null;  // the HTTP port has neither TLS nor signatures: a secured cluster refuses it
        }
        HttpPort known = httpOf.get(node);
        if (known == null) {
            LiveGroup.Node metadata = LiveGroup.metadata(node, part.group, part.access);
            if (metadata == null) {
                return null;  // not answering now: gRPC finds out and fails over
            }
            String address = RawHttp.address(node, metadata.metricsAddress);
            known = address == null ? HttpPort.NONE : new HttpPort(address, metadata.selfId);
            httpOf.put(node, known);
        }
        return known == HttpPort.NONE ? null : known;
    }

    private String leader() throws IOException {
        LiveGroup.View view = LiveGroup.probe(part.servers, part.group, part.access);
        return view == null ? null : view.leader;
    }

    /** A call that failed in transport, or that the node refused (credentials, ACL). */
    private void failed(Grpc.Failure failure) throws IOException {
        if (failure.refused()) {
            throw new LiveGroup.Refused(failure.status == Grpc.UNAUTHENTICATED, failure.getMessage());
        }
        failed(0, failure.getMessage(), "");
    }

    /**
     * A node failed (code: its DLedger code, 0 for a transport failure): its
     * call is dropped; then wait, follow the leader it names, or fail over.
     */
    private void failed(int code, String why, String leaderAddress) throws IOException {
        drop();
        if (code == LiveGroup.UNAUTHENTICATED || code == LiveGroup.FORBIDDEN) {
            throw new LiveGroup.Refused(code == LiveGroup.UNAUTHENTICATED, why);
        }
        long waited = System.currentTimeMillis() - started;
        if (sources.get(0) == null) {
            if (waited >= LEADER_DEADLINE_MS) {
                failures.add("leader: " + why);
                throw new IOException("entries " + nextIndex + ".." + part.lastIndex + ": no node served them ("
                        + String.join("; ", failures) + ")");
            }
            if (code == LiveGroup.NOT_LEADER && !leaderAddress.isEmpty()) {
                leaderHint = leaderAddress;
            } else {
                LiveGroup.sleep(200);
            }
            return;
        }
        if (code == LiveGroup.INDEX_OUT_OF_RANGE && waited < REPLICA_WAIT_MS) {
            LiveGroup.sleep(100);  // behind the pinned index: it may catch up in a moment
            return;
        }
        failOver(why);
    }

    private void failOver(String why) throws IOException {
        String failed = sources.remove(0);
        failures.add(failed + ": " + why);
        started = System.currentTimeMillis();
        if (sources.isEmpty()) {
            throw new IOException("entries " + nextIndex + ".." + part.lastIndex + ": no node served them ("
                    + String.join("; ", failures) + ")");
        }
    }

    private void throttle(int length) throws IOException {
        bytes += length;
        if (part.maxBytesPerSecond > 0) {
            long ahead = bytes * 1000 / part.maxBytesPerSecond - (System.currentTimeMillis() - begun);
            if (ahead > 0) {
                LiveGroup.sleep(ahead);
            }
        }
    }

    private void drop() {
        if (raw != null) {
            raw.close();
            raw = null;
        }
        if (call != null) {
            call.close();
            call = null;
        }
        if (connection != null) {
            connection.close();
            connection = null;
        }
    }

    @Override
    public void close() {
        drop();
    }
}
