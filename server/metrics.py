"""Prometheus metrics: request counts and latencies by route template, method and status, and
each collection's index counters (``Collection.stats()``) and the C allocator's bytes
(``server.memory``), read when scraped.

    metrics = Metrics(catalog_getter=lambda: app.state.catalog)
    metrics.observe("/collections/{name}/points/query", "POST", 200, 0.0031)
    body, content_type = metrics.render()

Each app has its own registry (tests build many apps in one process). Route labels are
templates, never raw paths, so the label sets stay bounded.

Thread-safety: prometheus-client's metrics are thread-safe; the collector reads the catalog
from the scraping thread only through ``names``/``get``/``stats``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from server.memory import MallocCollector

__all__ = ["Metrics"]

log = logging.getLogger("tierkit.server")
_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
_NAME = re.compile(r"[^a-zA-Z0-9_]")


class _CollectionCollector(Collector):
    """One gauge family per counter name in ``stats()``, labelled by collection."""

    def __init__(self, catalog_getter: Callable[[], Any]) -> None:
        self._catalog_getter = catalog_getter

    def collect(self) -> Iterator[GaugeMetricFamily]:
        catalog = self._catalog_getter()
        if catalog is None:
            return
        families: dict[str, GaugeMetricFamily] = {}
        for name in catalog.names():
            try:
                collection = catalog.get(name)
                stats = collection.stats()
                points = collection.info().get("points_count", 0)
            except Exception:  # deleted between names() and get(): skip it this scrape
                continue
            for key, value in {"points": points, **stats}.items():
                if not isinstance(value, int | float) or isinstance(value, bool):
                    continue
                metric = "tierkit_collection_" + _NAME.sub("_", str(key))
                if metric not in families:
                    families[metric] = GaugeMetricFamily(
                        metric, f"collection counter {key}", labels=["collection"]
                    )
                families[metric].add_metric([name], float(value))
        yield from families.values()


class Metrics:
    def __init__(self, catalog_getter: Callable[[], Any]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tierkit_http_requests",
            "HTTP requests answered",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "tierkit_http_request_duration_seconds",
            "HTTP request latency",
            ["route", "method", "status"],
            buckets=_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_CollectionCollector(catalog_getter))
        self.registry.register(MallocCollector())

    def observe(self, route: str, method: str, status: int, duration_s: float) -> None:
        labels = (route, method, str(status))
        self.requests.labels(*labels).inc()
        self.latency.labels(*labels).observe(duration_s)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
