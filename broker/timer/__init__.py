"""Delayed and timed messages.

A producer asks for delay one of two ways over the 5.x protocol:
- `delivery_timestamp` (any time up to `max_delay_s` ahead): the message is
  stored in the timer topic `rmq_sys_wheel_timer` (queue 0), as RocketMQ 5's
  timer wheel stores it;
- a delay level 1..18, carried as the user property `DELAY` (RocketMQ's own
  name for it, which 4.x's `Message.setDelayTimeLevel` writes); message type
  DELAY or NORMAL, no delivery_timestamp: stored in `SCHEDULE_TOPIC_XXXX`,
  queue = level - 1, due the level's delay after it is stored, as RocketMQ's
  ScheduleMessageService does.

Either way the stored message keeps its topic and queue in REAL_TOPIC and
REAL_QID and its due time in TIMER_DELIVER_MS; consumers cannot read system
topics, so it stays invisible. A delivery time already past is stored in the
real topic at once.

What is replicated: the timer message itself (every replica's TimerState adds
it when it applies it), the delivered copy (it names its timer in
TIMER_ORIGIN_OFFSET; applying it marks the timer done on every replica) and
cancellations (a TIMER_CANCEL system entry: a recall, or a timer whose topic
is gone). Only the leader delivers, and only once it has applied its log up to
the start of its term: a new leader then knows every delivery an earlier
leader committed, and those it did not commit are not in its log, so each
timer is delivered exactly once across failovers.
"""
