package io.pydledger.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.types.StructType;

/**
 * The live-mode options the JVM reader takes (batch reads of a running
 * group), parsed as spark/options.py parses them; {@link #parse} returns null
 * for anything else (a row selection, decode=tuples, an option it does not
 * know, a value it does not read exactly as Python does), and the Python
 * source then takes the query and says what is wrong, if anything.
 */
final class LiveOptions implements Serializable {
    private static final long serialVersionUID = 1L;

    static final Set<String> TAKEN = new HashSet<>(Arrays.asList(
            "servers", "group", "topic", "startindex", "endindex", "startingoffsets", "endingoffsets",
            "includeproperties", "minpartitions", "entriesperpartition", "preferreplicas", "maxbytespersecond",
            "user", "secretfile", "tlsca", "decode", "failondataloss", "maxentriespertrigger", "reader",
            "livetransport"));
    static final long DEFAULT_ENTRIES_PER_PARTITION = 100_000;

    final List<String> servers;
    final String group;
    final Set<String> topics;  // null: every row
    final Long startIndex;
    final Long endIndex;
    final Long startingIndex;  // startingOffsets as a log index (null: earliest)
    final boolean includeProperties;
    final int minPartitions;
    final long entriesPerPartition;
    final boolean preferReplicas;
    final long maxBytesPerSecond;  // 0: unthrottled
    final boolean rawHttp;  // liveTransport=auto: runs from a node's HTTP port where it offers them (RawHttp)
    final LiveAccess access;

    private LiveOptions(Map<String, String> values) {
        servers = addresses(values.get("servers"));
        group = values.getOrDefault("group", "default");
        Set<String> wanted = new HashSet<>();
        for (String topic : values.getOrDefault("topic", "").split(",")) {
            if (!topic.trim().isEmpty()) {
                wanted.add(topic.trim());
            }
        }
        topics = wanted.isEmpty() ? null : wanted;
        startIndex = FileOptions.optional(values, "startindex");
        endIndex = FileOptions.optional(values, "endindex");
        String starting = values.getOrDefault("startingoffsets", "").trim();
        startingIndex = FileOptions.digits(starting) ? Long.valueOf(starting) : null;
        includeProperties = values.getOrDefault("includeproperties", "true").trim().equalsIgnoreCase("true");
        long min = FileOptions.integer(values, "minpartitions", 0);
        minPartitions = min > 0 ? (int) Math.min(min, Integer.MAX_VALUE) : Runtime.getRuntime().availableProcessors();
        long per = FileOptions.integer(values, "entriesperpartition", 0);
        entriesPerPartition = per > 0 ? per : DEFAULT_ENTRIES_PER_PARTITION;
        preferReplicas = values.getOrDefault("preferreplicas", "true").trim().equalsIgnoreCase("true");
        maxBytesPerSecond = FileOptions.integer(values, "maxbytespersecond", 0);
        rawHttp = values.getOrDefault("livetransport", "auto").trim().equalsIgnoreCase("auto");
        access = new LiveAccess(values.getOrDefault("user", "").trim(), values.getOrDefault("secretfile", "").trim(),
                values.getOrDefault("tlsca", "").trim());
    }

    /** HOST:PORT,... as the Python source reads it; null when it would refuse the text. */
    static List<String> addresses(String text) {
        if (text == null) {
            return null;
        }
        List<String> found = new ArrayList<>();
        for (String part : text.split(",")) {
            String address = part.trim();
            if (address.isEmpty()) {
                continue;
            }
            int colon = address.lastIndexOf(':');
            if (colon <= 0 || !FileOptions.digits(address.substring(colon + 1))) {
                return null;
            }
            int port = Integer.parseInt(address.substring(colon + 1));
            if (port < 1 || port > 65535) {
                return null;
            }
            found.add(address);
        }
        return found.isEmpty() ? null : found;
    }

    /** Why the JVM live reader does not take these options, or null when it does. */
    static String refusal(Map<String, String> options) {
        Map<String, String> values = FileOptions.lower(options);
        String others = FileOptions.untaken(values, TAKEN);
        if (others != null) {
            return others;
        }
        if (addresses(values.get("servers")) == null) {
            return "servers=" + values.get("servers") + " is not HOST:PORT,...";
        }
        String transport = values.getOrDefault("livetransport", "auto").trim().toLowerCase();
        if (!transport.equals("auto") && !transport.equals("grpc")) {
            return "liveTransport=" + transport + " is neither auto nor grpc";  // Python says so
        }
        return FileOptions.shared(values);
    }

    /** The options, when the JVM live reader takes them (see {@link #refusal}); else null. */
    static LiveOptions parse(Map<String, String> options) {
        return refusal(options) != null ? null : new LiveOptions(FileOptions.lower(options));
    }

    /** Whether these options are live mode's (servers given, no path). */
    static boolean live(Map<String, String> options) {
        Map<String, String> values = FileOptions.lower(options);
        return !FileOptions.blank(values.get("servers")) && FileOptions.blank(values.get("path"));
    }

    StructType schema() {
        return includeProperties ? Columns.SCHEMA : Columns.WITHOUT_PROPERTIES;
    }
}
