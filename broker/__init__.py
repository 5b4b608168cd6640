"""The RocketMQ 5 messaging API (apache.rocketmq.v2) over the message store."""
