"""Transactional messages.

A transactional send stores a half message: topic RMQ_SYS_TRANS_HALF_TOPIC
(queue 0), sys flag TRANSACTION_PREPARED_TYPE (so no ConsumeQueue lists it),
the real topic and queue in REAL_TOPIC/REAL_QID and when to first check it
back in CHECK_IMMUNITY_TIME_IN_SECONDS (the producer's
orphaned_transaction_recovery_duration, else `transaction_timeout_s`). The
answer's transaction_id is the half message's offset message id.

EndTransaction COMMIT stores a commit-type copy in the real topic whose
PREPAREDTRANSACTIONOFFSET is the half message's physical offset (RocketMQ's
own link); ROLLBACK writes a TRANSACTION_ROLLBACK system entry. Undecided half
messages are checked back with a producer of their topic (one whose Telemetry
settings name the topic) through its Telemetry stream
(recover_orphaned_transaction_command), every `transaction_check_interval_s`,
each check counted by a TRANSACTION_CHECK system entry, and rolled back after
`transaction_check_max` checks. Unlike RocketMQ, a check counts only when a
producer was connected to receive it: a producer whose stream was cut by a
failover must not come back to find its transactions rolled back unasked. A
half message nobody answers is still rolled back after
`transaction_max_lifetime_s`.

What is replicated: the half message, the commit copy, rollbacks and check
counts; every replica's TransactionState is derived from them alone. Only the
leader commits, rolls back and checks, and only once it has applied its log
to the start of its term, so after a failover a committed transaction is not
committed again and an undecided one is still checked, from the count it had.
"""
