package io.pydledger.spark;

import java.io.Serializable;
import java.util.Arrays;
import java.util.HashSet;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The file-mode options the JVM reader takes, parsed the way spark/options.py
 * parses them. {@link #parse} returns null for anything else (live mode, the
 * row selections, decode=tuples, a value it does not read exactly as Python
 * does, an option it does not know): the Python source then takes the query,
 * and its SourceOptions.parse is what accepts it or says what is wrong.
 */
final class FileOptions implements Serializable {
    private static final long serialVersionUID = 1L;

    /** Option names (lower-cased, as Spark hands them over) the JVM reader reads. */
    static final Set<String> TAKEN = new HashSet<>(Arrays.asList(
            "path", "nodeid", "topic", "startindex", "endindex", "startingoffsets", "endingoffsets",
            "includeproperties", "maxpartitionbytes", "minpartitions", "decode", "group", "failondataloss",
            "maxentriespertrigger", "reader"));
    static final long DEFAULT_MAX_PARTITION_BYTES = 128L << 20;

    final String path;
    final String nodeId;
    final Set<String> topics;  // null: every row
    final Long startIndex;
    final Long endIndex;
    final Long startingIndex;  // startingOffsets as a log index (null: earliest)
    final boolean includeProperties;
    final long maxPartitionBytes;
    final int minPartitions;

    private FileOptions(String path, String nodeId, Set<String> topics, Long startIndex, Long endIndex,
                        Long startingIndex, boolean includeProperties, long maxPartitionBytes, int minPartitions) {
        this.path = path;
        this.nodeId = nodeId;
        this.topics = topics;
        this.startIndex = startIndex;
        this.endIndex = endIndex;
        this.startingIndex = startingIndex;
        this.includeProperties = includeProperties;
        this.maxPartitionBytes = maxPartitionBytes;
        this.minPartitions = minPartitions;
    }

    /** The reader option: auto (default), jvm or python; null when it is none of these. */
    static String readerChoice(Map<String, String> options) {
        String value = lower(options).getOrDefault("reader", "auto").trim().toLowerCase(Locale.ROOT);
        return value.isEmpty() ? "auto" : (value.equals("auto") || value.equals("jvm") || value.equals("python")
                ? value : null);
    }

    /** Why the JVM reader does not take these options, or null when it does. */
    static String refusal(Map<String, String> options) {
        Map<String, String> values = lower(options);
        String others = untaken(values, TAKEN);
        if (others != null) {
            return others;
        }
        if (blank(values.get("path"))) {
            return "no path";
        }
        return shared(values);
    }

    /** The options a reader does not take, said as a refusal; null when it takes them all. */
    static String untaken(Map<String, String> values, Set<String> taken) {
        Set<String> others = new TreeSet<>();
        for (String key : values.keySet()) {
            if (!taken.contains(key)) {
                others.add(key);
            }
        }
        return others.isEmpty() ? null : "options " + others + " are read by the Python reader only";
    }

    /** The checks of the options both JVM readers take (file and live mode); null when they pass. */
    static String shared(Map<String, String> values) {
        if (!blank(values.get("startindex")) && !blank(values.get("startingoffsets"))) {
            return "startIndex and startingOffsets contradict each other";
        }
        if (!blank(values.get("endindex")) && !blank(values.get("endingoffsets"))) {
            return "endIndex and endingOffsets contradict each other";
        }
        String decode = values.getOrDefault("decode", "arrow");
        if (!decode.equalsIgnoreCase("arrow")) {
            return "decode=" + decode + " is the Python reader's";
        }
        String ending = values.getOrDefault("endingoffsets", "latest").trim();
        if (!ending.equalsIgnoreCase("latest")) {
            return "endingOffsets per queue selects rows in the Python reader";
        }
        String starting = values.getOrDefault("startingoffsets", "").trim();
        if (!(starting.isEmpty() || starting.equalsIgnoreCase("earliest") || digits(starting))) {
            return "startingOffsets=" + starting + " is the Python reader's";
        }
        for (String key : new String[] {"startindex", "endindex", "maxpartitionbytes", "minpartitions",
                "maxentriespertrigger", "entriesperpartition", "maxbytespersecond"}) {
            String text = values.get(key);
            if (text != null && !text.isEmpty() && !digits(text)) {
                return key + "=" + text + " is not a plain integer";  // Python says what is wrong with it
            }
        }
        for (String key : new String[] {"maxpartitionbytes", "minpartitions", "maxentriespertrigger",
                "entriesperpartition", "maxbytespersecond"}) {
            String text = values.get(key);
            if (text != null && !text.isEmpty() && Long.parseLong(text) < 1) {
                return key + "=" + text + " is below 1";
            }
        }
        for (String key : new String[] {"includeproperties", "failondataloss", "preferreplicas"}) {
            String text = values.getOrDefault(key, "true").trim().toLowerCase(Locale.ROOT);
            if (!text.equals("true") && !text.equals("false")) {
                return key + "=" + text + " is not true or false";
            }
        }
        return null;
    }

    /** The options, when the JVM reader takes them (see {@link #refusal}); else null. */
    static FileOptions parse(Map<String, String> options) {
        if (refusal(options) != null) {
            return null;
        }
        Map<String, String> values = lower(options);
        Set<String> topics = new HashSet<>();
        for (String topic : values.getOrDefault("topic", "").split(",")) {
            if (!topic.trim().isEmpty()) {
                topics.add(topic.trim());
            }
        }
        String starting = values.getOrDefault("startingoffsets", "").trim();
        long maxBytes = integer(values, "maxpartitionbytes", 0);
        long minPartitions = integer(values, "minpartitions", 0);
        return new FileOptions(values.get("path"), blank(values.get("nodeid")) ? null : values.get("nodeid"),
                topics.isEmpty() ? null : topics, optional(values, "startindex"), optional(values, "endindex"),
                digits(starting) ? Long.valueOf(starting) : null,
                values.getOrDefault("includeproperties", "true").trim().equalsIgnoreCase("true"),
                maxBytes > 0 ? maxBytes : DEFAULT_MAX_PARTITION_BYTES,
                minPartitions > 0 ? (int) Math.min(minPartitions, Integer.MAX_VALUE)
                        : Runtime.getRuntime().availableProcessors());
    }

    /** The source's schema (spark/schema.py), without properties when includeProperties=false. */
    StructType schema() {
        return includeProperties ? Columns.SCHEMA : Columns.WITHOUT_PROPERTIES;
    }

    /** Whether a query's own schema is a subset of ours (names, and types up to nullability). */
    static boolean acceptable(StructType schema) {
        for (StructField field : schema.fields()) {
            int at = Columns.position(field.name());
            if (at < 0 || !nullable(field.dataType()).equals(nullable(Columns.SCHEMA.fields()[at].dataType()))) {
                return false;
            }
        }
        return true;
    }

    private static DataType nullable(DataType type) {
        if (type instanceof ArrayType) {
            return DataTypes.createArrayType(nullable(((ArrayType) type).elementType()), true);
        }
        if (type instanceof MapType) {
            MapType map = (MapType) type;
            return DataTypes.createMapType(nullable(map.keyType()), nullable(map.valueType()), true);
        }
        return type;
    }

    static Map<String, String> lower(Map<String, String> options) {
        Map<String, String> values = new java.util.HashMap<>();
        for (Map.Entry<String, String> e : options.entrySet()) {
            values.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue() == null ? "" : e.getValue());
        }
        return values;
    }

    static boolean blank(String text) {
        return text == null || text.trim().isEmpty();
    }

    static boolean digits(String text) {
        if (text.isEmpty() || text.length() > 18) {
            return false;
        }
        for (int k = 0; k < text.length(); k++) {
            if (text.charAt(k) < '0' || text.charAt(k) > '9') {
                return false;
            }
        }
        return true;
    }

    static long integer(Map<String, String> values, String key, long otherwise) {
        String text = values.get(key);
        return text == null || text.isEmpty() ? otherwise : Long.parseLong(text);
    }

    static Long optional(Map<String, String> values, String key) {
        String text = values.get(key);
        return text == null || text.isEmpty() ? null : Long.valueOf(text);
    }
}
