"""Dead letters: a message that used up its delivery attempts (or that a
client forwards) is copied to the group's dead-letter topic `%DLQ%<group>`,
then its lease is ended with a `dead` op.

The copy keeps the message id (UNIQ_KEY) and says where it came from
(DLQ_ORIGIN_TOPIC, DLQ_ORIGIN_MESSAGE_ID, delivered as the protocol's
dead_letter_queue system property); RECONSUME_TIME holds the attempts made
after the first.

Three steps, so that an ack racing the move cannot also win it: a `dying` op
takes the leases (a compare-and-set, like the ack's: exactly one of the two
takes effect), the copies of the messages whose lease it took are written,
then a `dead` op ends those leases. A failover after the first step leaves
the leases expired and out of attempts, and the next leader's revive moves
them: a second copy rather than a lost message.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from broker.consumer.committer import ClaimTable, PopCommitter
from broker.consumer.pop_state import AckOp, DyingOp, PopStateManager
from broker.consumer.receive import max_attempts
from broker.topics import TopicService, dlq_topic
from store import message_const as mc
from store.codec import MessageExt
from store.message_store import MessageStore
from store.subscription_group import SubscriptionGroupConfig

log = logging.getLogger(__name__)


@dataclass
class DeadLetter:
    queue_id: int
    offset: int
    lease: int
    attempt: int
    message: MessageExt | None   # None: retention removed it, nothing to copy


def dead_letter_copy(stored: MessageExt, group: str, origin_topic: str, attempt: int) -> MessageExt:
    properties = dict(stored.properties)
    properties[mc.DLQ_ORIGIN_TOPIC] = origin_topic
    properties[mc.DLQ_ORIGIN_MESSAGE_ID] = stored.properties.get(mc.UNIQ_KEY, "")
    properties[mc.RECONSUME_TIME] = str(attempt - 1)
    return MessageExt(topic=dlq_topic(group), body=stored.body, queue_id=0, flag=stored.flag,
                      sys_flag=stored.sys_flag & mc.COMPRESSED_FLAG, born_timestamp=stored.born_timestamp,
                      born_host=stored.born_host, reconsume_times=attempt - 1, properties=properties)


class DeadLetterService:
    def __init__(self, store: MessageStore, topics: TopicService, state: PopStateManager, committer: PopCommitter,
                 claims: ClaimTable) -> None:
        self.store = store
        self.topics = topics
        self.state = state
        self.committer = committer
        self.claims = claims
        self.forwarded = 0

    async def forward(self, group: str, topic: str, letters: list[DeadLetter], reason: str,
                      now_ms: int) -> list[DeadLetter]:
        """Take the leases, copy the messages to %DLQ%<group>, end the leases;
        returns the letters moved (not those an ack or another call ended first)."""
        keys = [((group, topic, letter.queue_id), [letter.offset]) for letter in letters]
        for key, offsets in keys:
            self.claims.hold(key, None, offsets, [])
        try:
            taken = await self._take(group, topic, letters, now_ms)
            copies = [dead_letter_copy(letter.message, group, topic, letter.attempt)
                      for letter, _ in taken if letter.message is not None]
            if copies:
                await self.topics.ensure_system(dlq_topic(group))
                await self.store.put_messages(copies)
            ops: dict[int, AckOp] = {}
            for letter, dying_lease in taken:
                ops.setdefault(letter.queue_id, AckOp(group, topic, letter.queue_id, [], dead=True)).acks.append(
                    (letter.offset, dying_lease))
            if ops:
                await self.committer.commit(list(ops.values()))
        finally:
            for key, offsets in keys:
                self.claims.release(key, None, offsets, [])
        self.forwarded += len(copies)
        if taken:
            log.info("moved %d message(s) of %s to %s: %s (%d more gone with retention)", len(copies), topic,
                     dlq_topic(group), reason, len(taken) - len(copies))
        return [letter for letter, _ in taken]

    async def _take(self, group: str, topic: str, letters: list[DeadLetter],
                    now_ms: int) -> list[tuple[DeadLetter, int]]:
        """The `dying` step: the letters whose lease it took, each with the
        lease that replaced it."""
        last = max_attempts(self.store.groups.get(group) or SubscriptionGroupConfig(group))
        ops: dict[int, DyingOp] = {}
        for letter in letters:
            ops.setdefault(letter.queue_id, DyingOp(group, topic, letter.queue_id, now_ms, [])).claims.append(
                (letter.offset, letter.lease, max(letter.attempt, last)))
        index = await self.committer.commit(list(ops.values()))
        taken = []
        for letter in letters:
            lease = self.state.lease_of(group, topic, letter.queue_id, letter.offset)
            if lease is not None and lease.lease == index:
                taken.append((letter, index))
        return taken
