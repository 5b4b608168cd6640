"""Prometheus metrics of a name server, in a registry of its own (so that a
test may run several in one process)."""
from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class _TableCollector(Collector):
    """Groups registered and expiries, read from the table at scrape time."""

    def __init__(self, groups: Callable[[], int], expiries: Callable[[], int]) -> None:
        self.groups = groups
        self.expiries = expiries

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("dledger_namesrv_groups_registered", "Broker groups registered here",
                                value=self.groups())
        yield CounterMetricFamily("dledger_namesrv_expiries", "Groups dropped for not registering in time",
                                  value=self.expiries())


class NameServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.registrations = Counter("dledger_namesrv_registrations", "Registrations accepted",
                                     registry=self.registry)
        self.registrations_refused = Counter("dledger_namesrv_registrations_refused",
                                             "Registrations refused (malformed or claiming another group)",
                                             registry=self.registry)
        self.route_queries = Counter("dledger_namesrv_route_queries", "RouteByTopic calls served",
                                     registry=self.registry)
        self.auth_denied = Counter("dledger_namesrv_auth_denied", "Calls refused by authentication or ACLs",
                                   ["reason", "rpc"], registry=self.registry)
        self._http: tuple[object, object] | None = None

    def watch_table(self, groups: Callable[[], int], expiries: Callable[[], int]) -> None:
        self.registry.register(_TableCollector(groups, expiries))

    def serve(self, host: str, port: int) -> None:
        self._http = start_http_server(port, addr=host, registry=self.registry)

    def close(self) -> None:
        if self._http is not None:
            server, thread = self._http
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]
            thread.join(timeout=2.0)  # type: ignore[attr-defined]
            self._http = None
