"""StoreCheckpoint (`store/checkpoint`) and the abort marker (`store/abort`).

RocketMQ's checkpoint records, as big-endian longs at fixed places, how far
the derived files were flushed: physicMsgTimestamp (0), logicsMsgTimestamp
(8), indexMsgTimestamp (16), masterFlushedOffset (24), confirmPhyOffset (32).
We keep that layout, so an operator's tools read it, and add at 40 the index
of the last log entry whose ConsumeQueue units, index items and metadata were
flushed: the apply loop resumes after it, so recovery time grows with the
unflushed tail, not with the log. At 48, the entry format the store was
derived with: 0 (files of versions before the DLedger header's channel, which
applied any entry whose body looked like a store entry) or 1 (only entries
tagged CHANNEL_STATE_MACHINE; see store/reput.py).

`abort` exists while the store runs; finding it at start means the last run
did not stop cleanly (RocketMQ then recovers "abnormally"; here the recovery
is the same either way, but it is logged).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from dledger.store.properties import write_atomic
from store.errors import CorruptFileError

_LAYOUT = struct.Struct(">qqqqqqq")
ENTRY_FORMAT_UNTAGGED = 0
ENTRY_FORMAT_CHANNEL = 1
FILE_SIZE = 4096  # RocketMQ maps an OS page


@dataclass
class StoreCheckpoint:
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0
    applied_index: int = -1
    entry_format: int = ENTRY_FORMAT_CHANNEL

    @classmethod
    def load(cls, path: str) -> "StoreCheckpoint | None":
        if not os.path.exists(path):
            return None
        with open(path, "rb") as file:
            data = file.read()
        if len(data) < _LAYOUT.size:
            raise CorruptFileError(f"{path}: {len(data)} bytes, a checkpoint needs {_LAYOUT.size}")
        return cls(*_LAYOUT.unpack_from(data))

    def save(self, path: str) -> None:
        data = bytearray(FILE_SIZE)
        _LAYOUT.pack_into(data, 0, self.physic_msg_timestamp, self.logics_msg_timestamp,
                          self.index_msg_timestamp, self.master_flushed_offset, self.confirm_phy_offset,
                          self.applied_index, self.entry_format)
        write_atomic(path, bytes(data))


def mark_running(path: str) -> bool:
    """Create the abort marker; True when it was already there (a crash)."""
    existed = os.path.exists(path)
    with open(path, "wb"):
        pass
    return existed


def mark_stopped(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
