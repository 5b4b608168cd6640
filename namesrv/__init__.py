"""The name server: where broker groups register and routes are looked up
(RocketMQ's NameServer). route_table.py holds every rule as plain methods;
service.py is the gRPC translation; server.py runs the process."""
