"""RocketMQ's message property names (MessageConst) and SYSFLAG bits (MessageSysFlag).

The names are RocketMQ's own strings, so a message stored here reads the same
to anyone who knows RocketMQ, and a RocketMQ tool reading our commit log finds
the properties it expects.
"""
from __future__ import annotations

from typing import Final

# --- Property names (MessageConst.PROPERTY_*) ---------------------------------

KEYS: Final = "KEYS"                                   # business keys, space separated, indexed
TAGS: Final = "TAGS"                                   # the single tag; its hash goes into ConsumeQueue units
WAIT_STORE_MSG_OK: Final = "WAIT"
DELAY_TIME_LEVEL: Final = "DELAY"                      # 4.x delay level 1..18
RETRY_TOPIC: Final = "RETRY_TOPIC"                     # original topic of a message sent to %RETRY%group
REAL_TOPIC: Final = "REAL_TOPIC"                       # topic to restore when a delayed/half message is delivered
REAL_QUEUE_ID: Final = "REAL_QID"
TRANSACTION_PREPARED: Final = "TRAN_MSG"               # "true" on a half (prepared) message
PRODUCER_GROUP: Final = "PGROUP"
MIN_OFFSET: Final = "MIN_OFFSET"
MAX_OFFSET: Final = "MAX_OFFSET"
BUYER_ID: Final = "BUYER_ID"
ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"         # id of the message a retry copy came from
TRANSFER_FLAG: Final = "TRANSFER_FLAG"
CORRECTION_FLAG: Final = "CORRECTION_FLAG"
MQ2_FLAG: Final = "MQ2_FLAG"
RECONSUME_TIME: Final = "RECONSUME_TIME"
MSG_REGION: Final = "MSG_REGION"
TRACE_SWITCH: Final = "TRACE_ON"
UNIQ_CLIENT_MESSAGE_ID_KEYIDX: Final = "UNIQ_KEY"      # the client message id (5.x: 34 hex chars)
UNIQ_KEY: Final = UNIQ_CLIENT_MESSAGE_ID_KEYIDX
EXTEND_UNIQ_INFO: Final = "EXTEND_UNIQ_INFO"
MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
CONSUME_START_TIMESTAMP: Final = "CONSUME_START_TIME"
INNER_NUM: Final = "INNER_NUM"
INNER_BASE: Final = "INNER_BASE"
DUP_INFO: Final = "DUP_INFO"
CHECK_IMMUNITY_TIME_IN_SECONDS: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"  # transaction check-back delay
TRANSACTION_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
TRANSACTION_ID: Final = "__transactionId__"
TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
INSTANCE_ID: Final = "INSTANCE_ID"
CORRELATION_ID: Final = "CORRELATION_ID"
MESSAGE_REPLY_TO_CLIENT: Final = "REPLY_TO_CLIENT"
MESSAGE_TTL: Final = "TTL"
REPLY_MESSAGE_ARRIVE_TIME: Final = "ARRIVE_TIME"
PUSH_REPLY_TIME: Final = "PUSH_REPLY_TIME"
CLUSTER: Final = "CLUSTER"
MESSAGE_TYPE: Final = "MSG_TYPE"
POP_CK: Final = "POP_CK"
POP_CK_OFFSET: Final = "POP_CK_OFFSET"
FIRST_POP_TIME: Final = "1ST_POP_TIME"
SHARDING_KEY: Final = "__SHARDINGKEY"                  # the 5.x message group (FIFO)
MESSAGE_GROUP: Final = SHARDING_KEY
FORWARD_QUEUE_ID: Final = "PROPERTY_FORWARD_QUEUE_ID"
REDIRECT: Final = "REDIRECT"
INNER_MULTI_DISPATCH: Final = "INNER_MULTI_DISPATCH"
INNER_MULTI_QUEUE_OFFSET: Final = "INNER_MULTI_QUEUE_OFFSET"
TRACE_CONTEXT: Final = "TRACE_CONTEXT"
TIMER_DELAY_SEC: Final = "TIMER_DELAY_SEC"
TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"           # 5.x: absolute delivery time, ms since the epoch
TIMER_DELAY_MS: Final = "TIMER_DELAY_MS"
TIMER_ENQUEUE_MS: Final = "TIMER_ENQUEUE_MS"
TIMER_DEQUEUE_MS: Final = "TIMER_DEQUEUE_MS"
TIMER_ROLL_TIMES: Final = "TIMER_ROLL_TIMES"
TIMER_OUT_MS: Final = "TIMER_OUT_MS"
TIMER_DEL_UNIQKEY: Final = "TIMER_DEL_UNIQKEY"
TIMER_DEL_MS: Final = "TIMER_DEL_MS"
TIMER_DELAY_LEVEL: Final = "TIMER_DELAY_LEVEL"
# Ours: on a message a timer delivered, the physical offset of the timer
# message it came from; applying the copy marks that timer done on every replica.
TIMER_ORIGIN_OFFSET: Final = "TIMER_ORIGIN_OFFSET"
BORN_HOST: Final = "__BORNHOST"
BORN_TIMESTAMP: Final = "BORN_TIMESTAMP"
CRC32: Final = "__CRC32#"
DLQ_ORIGIN_TOPIC: Final = "DLQ_ORIGIN_TOPIC"
DLQ_ORIGIN_MESSAGE_ID: Final = "DLQ_ORIGIN_MESSAGE_ID"

# Properties whose name starts with this are never stored by RocketMQ.
TRANSIENT_PREFIX: Final = "__RMQ.TRANSIENT."

# KEYS holds several keys separated by one space.
KEY_SEPARATOR: Final = " "

# Largest encoded properties (the length field is a Java short).
MAX_PROPERTIES_LENGTH: Final = 32767

# --- SYSFLAG bits (MessageSysFlag) --------------------------------------------

COMPRESSED_FLAG: Final = 0x1
MULTI_TAGS_FLAG: Final = 0x1 << 1
TRANSACTION_NOT_TYPE: Final = 0
TRANSACTION_PREPARED_TYPE: Final = 0x1 << 2
TRANSACTION_COMMIT_TYPE: Final = 0x2 << 2
TRANSACTION_ROLLBACK_TYPE: Final = 0x3 << 2
BORNHOST_V6_FLAG: Final = 0x1 << 4
STOREHOSTADDRESS_V6_FLAG: Final = 0x1 << 5
NEED_UNWRAP_FLAG: Final = 0x1 << 6
INNER_BATCH_FLAG: Final = 0x1 << 7

# The two transaction bits together.
TRANSACTION_TYPE_MASK: Final = TRANSACTION_ROLLBACK_TYPE


def transaction_type(sys_flag: int) -> int:
    """TRANSACTION_NOT_TYPE, _PREPARED_TYPE, _COMMIT_TYPE or _ROLLBACK_TYPE."""
    return sys_flag & TRANSACTION_TYPE_MASK


def with_transaction_type(sys_flag: int, type_: int) -> int:
    """`sys_flag` with its transaction bits replaced by `type_`."""
    return (sys_flag & ~TRANSACTION_TYPE_MASK) | type_
