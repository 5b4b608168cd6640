"""ConsumerConfig: the consumption side's tunables, each default explained once."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class ConsumerConfig:
    # Largest batch_size a ReceiveMessage or PullMessage may ask for (the 5.x
    # proxy's receive limit and RocketMQ's maxTransferCountOnMessageInMemory).
    max_batch_size: int = 32
    # The same for a receive that asks for its batch in one response (our own
    # extension, batched_response; NATS's pull consumers fetch 64 at a time):
    # each receive and each ack is a call whose cost the batch shares, so 64
    # a call cost the leader about a quarter less per message than 32. The
    # answer stays bounded in bytes as any receive's (DEFAULT_MAX_PULL_BYTES).
    max_batched_receive_size: int = 128
    # A receive that names no invisible duration (a push consumer asking the
    # server to manage it, auto_renew) gets the proxy's default lease.
    default_invisible_duration: timedelta = timedelta(seconds=60)
    # Appends of pop state changes in flight at once; everything arriving
    # meanwhile waits and rides in the next entry (group commit).
    max_in_flight_appends: int = 2
    # A long poll answers this much before the call's deadline, so that the
    # answer (and the messages now leased to the client) arrives in time.
    deadline_margin: timedelta = timedelta(milliseconds=500)
    # A waiting receive looks at leadership at least this often: a node that
    # lost it answers so that the client's retry finds the new leader.
    leader_check_interval_s: float = 1.0
    # The revive service (dead-lettering, consumer offset commits) runs this often.
    revive_interval_s: float = 0.2
    # The most messages one revive moves to dead-letter queues; the rest wait
    # for the next (each is read and copied on the event loop, and a backlog
    # that ran out of attempts together must not stall it).
    dead_letters_per_revive: int = 1000
    # The most leases one revive takes off the deadline heap to find those
    # out of attempts (about 2 us each): a backlog of expired leases is
    # looked at a slice per tick, each lease once, not all of it every tick.
    leases_per_revive: int = 5000
    # Consumed offsets are written to consumerOffset.json (through the log) this
    # often (RocketMQ's clients commit every 5 s; we commit for them).
    offset_commit_interval_s: float = 1.0
    # FIFO: messages a receive may look at beyond its batch to find message
    # groups that are free, and the most messages a queue may hold back for
    # busy groups before its scan waits for them.
    fifo_scan_extra: int = 64
    fifo_max_blocked: int = 2000
    # FIFO groups retry after this long (RocketMQ's fixed FIFO retry interval).
    fifo_retry_interval: timedelta = timedelta(seconds=3)
    # How long a receive waits for a new leader to apply the log before it
    # answers "not ready" (the client retries).
    ready_wait_s: float = 2.0
