"""Authentication (RocketMQ 5's request signature) and authorization (ACL 2.0)
of client calls; users and policies replicated through the log."""
