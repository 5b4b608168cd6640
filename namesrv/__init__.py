"""The name server: where broker groups register and routes are looked up
(RocketMQ's NameServer). route_table.py holds every rule as plain methods;
service.py is the gRPC translation; metrics.py its counters. The process
(ports, the expiry scanner) is run by cluster/nameserver.py, as cluster/ is
where ports open and tasks start."""
