"""MessageStoreConfig: the message store's tunables, each default explained once.

Defaults are RocketMQ's (MessageStoreConfig / BrokerConfig) unless a line says
why we differ.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MessageStoreConfig:
    # <node dir>/store: consumequeue/, index/, config/, checkpoint, abort.
    store_dir: str

    # ConsumeQueue files hold this many 20-byte units (RocketMQ: 300,000 = 5.7 MiB).
    consume_queue_units_per_file: int = 300_000
    # IndexFile: 5,000,000 hash slots and 20,000,000 items per file (420 MB,
    # created sparse, so the disk holds only what is written).
    index_hash_slots: int = 5_000_000
    index_items: int = 20_000_000
    message_index_enable: bool = True

    # The apply loop reads committed entries in chunks of at most this many bytes.
    reput_batch_bytes: int = 4 << 20
    # ConsumeQueues and index files are flushed, and the store checkpoint
    # written, this often (RocketMQ: flushIntervalConsumeQueue 1000 ms).
    flush_interval_s: float = 1.0
    # topics.json, subscriptionGroup.json, consumerOffset.json are rewritten
    # this often when they changed (RocketMQ: flushConsumerOffsetInterval 5 s).
    config_persist_interval_s: float = 5.0
    # How often ConsumeQueues and index files below the log's first retained
    # entry are deleted (the log's own retention runs in dledger/).
    clean_interval_s: float = 10.0

    # The leader keeps its newest committed messages decoded, up to this many
    # stored bytes, for consumers reading the tail (store/hot_messages.py); 0: none.
    hot_message_bytes: int = 64 << 20

    # Limits of a put (RocketMQ: maxMessageSize 4 MiB, properties < 32 KiB).
    max_message_size: int = 4 << 20
    # A new leader waits this long for its apply loop to reach the start of
    # its term before a put answers "not ready" (the client retries).
    ready_wait_s: float = 2.0
    # The leader writes the whole metadata into the log this often (and when
    # its term starts), so that the retained log always holds all of it.
    metadata_snapshot_interval_s: float = 600.0
    # Apply every NORMAL entry whose body looks like a store entry, as
    # versions before the header's channel did, instead of only the entries
    # the store wrote itself (see store/reput.py). Only for a log written by
    # such a version, on every node alike: it trusts every log client.
    legacy_untagged_entries: bool = False

    @property
    def config_dir(self) -> str:
        return f"{self.store_dir}/config"
