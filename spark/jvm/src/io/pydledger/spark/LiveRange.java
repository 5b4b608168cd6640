package io.pydledger.spark;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * Entries firstIndex..lastIndex of a running group (spark/partitions.py's
 * LiveRange), fixed at planning so that a retried task reads the same
 * committed entries whoever leads by then: read from the replicas in order
 * (a different first one per partition), then from the leader.
 */
final class LiveRange implements InputPartition {
    private static final long serialVersionUID = 1L;

    final List<String> servers;
    final String group;
    final long firstIndex;
    final long lastIndex;
    final List<String> replicas;
    final long maxBytesPerSecond;  // 0: unthrottled
    final boolean rawHttp;  // may read runs from a node's HTTP port (RawHttp)
    final LiveAccess access;

    LiveRange(List<String> servers, String group, long firstIndex, long lastIndex, List<String> replicas,
              long maxBytesPerSecond, boolean rawHttp, LiveAccess access) {
        this.servers = new ArrayList<>(servers);
        this.group = group;
        this.firstIndex = firstIndex;
        this.lastIndex = lastIndex;
        this.replicas = new ArrayList<>(replicas);
        this.maxBytesPerSecond = maxBytesPerSecond;
        this.rawHttp = rawHttp;
        this.access = access;
    }

    /** As plan_live_ranges: at most entriesPerPartition each, at least about minPartitions of them. */
    static List<LiveRange> plan(LiveOptions options, long first, long last, List<String> replicas) {
        long count = last - first + 1;
        long per = options.entriesPerPartition;
        if (count > 0 && options.minPartitions > 1) {
            per = Math.min(per, Math.max(1, (count + options.minPartitions - 1) / options.minPartitions));
        }
        List<LiveRange> ranges = new ArrayList<>();
        for (long start = first; start <= last; start += per) {
            int k = replicas.isEmpty() ? 0 : ranges.size() % replicas.size();
            List<String> order = new ArrayList<>(replicas.subList(k, replicas.size()));
            order.addAll(replicas.subList(0, k));
            ranges.add(new LiveRange(options.servers, options.group, start, Math.min(last, start + per - 1), order,
                    options.maxBytesPerSecond, options.rawHttp, options.access));
        }
        return ranges;
    }
}
