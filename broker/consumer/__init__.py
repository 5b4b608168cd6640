"""The consumption side of the broker: pop consumption (ReceiveMessage,
AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue) on a
replicated pop state, and offset-based pull. See ConsumerService."""
from broker.consumer.consumer_service import ConsumerService

__all__ = ["ConsumerService"]
