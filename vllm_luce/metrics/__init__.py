"""vllm-luce's metrics in vLLM's ``/metrics`` (``vllm:luce_*``; the list is ``catalog.py``).

Producers call ``inc`` / ``set_total`` / ``set_gauge`` with a name from the catalog and labels
(each producer adds ``model_name``, from ``model_name(vllm_config)``). ``install()`` (run by the plugin's ``register()`` in every
process) names the directory where non-serving processes publish and registers the collector in
prometheus_client's default registry, the one vLLM serves and ``LLM.get_metrics()`` reads.
"""

from __future__ import annotations

from vllm_luce.metrics.store import MetricStore, Publisher, claim_directory

STORE = MetricStore()
_publisher = Publisher(STORE)
_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    claim_directory()
    from vllm_luce import hooks
    from vllm_luce.metrics.collector import LuceCollector

    hooks.register("prometheus_client:REGISTRY.register", LuceCollector(STORE))
    _installed = True


def inc(name: str, value: float = 1.0, **labels) -> None:
    _publisher.ensure_started()
    STORE.inc(name, value, **labels)


def set_total(name: str, value: float, **labels) -> None:
    _publisher.ensure_started()
    STORE.set_total(name, value, **labels)


def set_gauge(name: str, value: float, **labels) -> None:
    _publisher.ensure_started()
    STORE.set_gauge(name, value, **labels)


def flush() -> None:
    """Hand this process's values to the serving process now (``Publisher.flush``)."""
    _publisher.flush()


def remove_gauges(name: str) -> None:
    STORE.remove_gauges(name)


def model_name(vllm_config) -> str:
    """vLLM's ``model_name`` label value: the first served model name."""
    model = getattr(vllm_config, "model_config", None)
    name = getattr(model, "served_model_name", None) or getattr(model, "model", "")
    return name[0] if isinstance(name, (list, tuple)) else str(name)
