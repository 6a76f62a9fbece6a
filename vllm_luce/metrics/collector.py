"""The Prometheus collector in vLLM's metrics registry: this process's values plus the snapshots of
the server's other processes, as ``vllm:luce_*`` metric families (``catalog.py``)."""

from __future__ import annotations

import os

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from vllm_luce.metrics.catalog import CATALOG, PREFIX
from vllm_luce.metrics.store import DIR_ENV, MetricStore, merge, read_snapshots


class LuceCollector:
    def __init__(self, store: MetricStore):
        self.store = store

    def describe(self):
        return []  # families appear as producers report; never collides with vLLM's own names

    def collect(self):
        merged = merge([self.store.snapshot(), *read_snapshots(os.environ.get(DIR_ENV), os.getpid())])
        families = {}
        for kind, series in merged.items():
            for (name, labels), value in sorted(series.items()):
                entry = CATALOG.get(name)
                if entry is None or entry[0] != kind:
                    continue
                family = families.get(name)
                if family is None:
                    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                    family = families[name] = cls(PREFIX + name, entry[2], labels=[k for k, _ in labels])
                family.add_metric([v for _, v in labels], value)
        yield from families.values()
