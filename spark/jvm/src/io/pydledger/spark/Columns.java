package io.pydledger.spark;

import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/** The columns of spark/schema.py (same names, order, types and nullability). */
final class Columns {
    static final int INDEX = 0, TERM = 1, KIND = 2, TOPIC = 3, QUEUE_ID = 4, QUEUE_OFFSET = 5, PHYSICAL_OFFSET = 6,
            MESSAGE_ID = 7, KEYS = 8, TAGS = 9, PROPERTIES = 10, BORN_TIMESTAMP = 11, STORE_TIMESTAMP = 12, BODY = 13,
            STORE_SIZE = 14, SYS_FLAG = 15, TAGS_CODE = 16, SYSTEM_KIND = 17, COUNT = 18;

    static final StructType SCHEMA = new StructType(new StructField[] {
        field("index", DataTypes.LongType, false),
        field("term", DataTypes.LongType, false),
        field("kind", DataTypes.StringType, false),
        field("topic", DataTypes.StringType, true),
        field("queue_id", DataTypes.IntegerType, true),
        field("queue_offset", DataTypes.LongType, true),
        field("physical_offset", DataTypes.LongType, false),
        field("message_id", DataTypes.StringType, true),
        field("keys", DataTypes.createArrayType(DataTypes.StringType, false), true),
        field("tags", DataTypes.StringType, true),
        field("properties", DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType, false), true),
        field("born_timestamp", DataTypes.TimestampType, true),
        field("store_timestamp", DataTypes.TimestampType, true),
        field("body", DataTypes.BinaryType, false),
        field("store_size", DataTypes.IntegerType, false),
        field("sys_flag", DataTypes.IntegerType, true),
        field("tags_code", DataTypes.LongType, true),
        field("system_kind", DataTypes.StringType, true),
    });

    static final StructType WITHOUT_PROPERTIES;

    static {
        StructField[] fields = new StructField[COUNT - 1];
        int k = 0;
        for (StructField f : SCHEMA.fields()) {
            if (!f.name().equals("properties")) {
                fields[k++] = f;
            }
        }
        WITHOUT_PROPERTIES = new StructType(fields);
    }

    private Columns() {
    }

    private static StructField field(String name, org.apache.spark.sql.types.DataType type, boolean nullable) {
        return DataTypes.createStructField(name, type, nullable);
    }

    /** The column's position in SCHEMA, or -1. */
    static int position(String name) {
        String[] names = SCHEMA.fieldNames();
        for (int k = 0; k < names.length; k++) {
            if (names[k].equals(name)) {
                return k;
            }
        }
        return -1;
    }
}
