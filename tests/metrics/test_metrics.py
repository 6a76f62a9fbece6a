"""The metric store, its cross-process hand-off and the Prometheus collector (no vLLM)."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from vllm_luce.metrics.catalog import CATALOG, PREFIX
from vllm_luce.metrics.collector import LuceCollector
from vllm_luce.metrics.store import DIR_ENV, MetricStore, Publisher, merge, read_snapshots

ROOT = Path(__file__).resolve().parents[2]


def exposition(store: MetricStore) -> str:
    registry = CollectorRegistry()
    registry.register(LuceCollector(store))
    return generate_latest(registry).decode()


def test_counters_add_gauges_replace_and_labels_are_order_free():
    s = MetricStore()
    s.inc("dflash_drafts", model_name="m")
    s.inc("dflash_drafts", 2, model_name="m")
    s.set_gauge("dflash_gate_speculating", 1, model_name="m")
    s.set_gauge("dflash_gate_speculating", 0, model_name="m")
    s.inc("pflash_prompts", outcome="kept", model_name="m")
    s.inc("pflash_prompts", model_name="m", outcome="kept")
    merged = merge([s.snapshot()])
    assert merged["counter"][("dflash_drafts", (("model_name", "m"),))] == 3
    assert merged["counter"][("pflash_prompts", (("model_name", "m"), ("outcome", "kept")))] == 2
    assert merged["gauge"][("dflash_gate_speculating", (("model_name", "m"),))] == 0


def test_merge_sums_equal_series_of_processes_and_keeps_ranks_apart():
    a, b = MetricStore(), MetricStore()
    a.set_total("kvflash_page_outs", 5, rank=0)
    b.set_total("kvflash_page_outs", 7, rank=1)
    b.set_total("kvflash_page_outs", 1, rank=0)  # e.g. a second engine's rank 0
    merged = merge([a.snapshot(), json.loads(json.dumps(b.snapshot()))])["counter"]
    assert merged[("kvflash_page_outs", (("rank", "0"),))] == 6
    assert merged[("kvflash_page_outs", (("rank", "1"),))] == 7


def test_exposition_uses_vllm_names_types_and_help_and_drops_unknown_names():
    s = MetricStore()
    s.inc("dflash_accepted_tokens_per_pos", 4, position=0, model_name="tiny")
    s.set_gauge("kvflash_host_bytes", 4096, rank=0, model_name="tiny")
    s.inc("not_in_the_catalog", 1)
    s.set_gauge("dflash_drafts", 1)  # a catalog counter reported as a gauge is not exposed
    text = exposition(s)
    assert 'vllm:luce_dflash_accepted_tokens_per_pos_total{model_name="tiny",position="0"} 4.0' in text
    assert 'vllm:luce_kvflash_host_bytes{model_name="tiny",rank="0"} 4096.0' in text
    assert "# TYPE vllm:luce_kvflash_host_bytes gauge" in text
    assert f"# HELP vllm:luce_kvflash_host_bytes {CATALOG['kvflash_host_bytes'][2]}" in text
    assert "not_in_the_catalog" not in text and "luce_dflash_drafts" not in text


def test_publisher_hands_values_to_the_serving_process(tmp_path, monkeypatch):
    """Another process publishes its snapshot; this one's collector reads it with its own values."""
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    child = (
        "import time, vllm_luce.metrics as m\n"
        "m.inc('kvflash_page_outs', 3, rank=0)\n"
        "m._publisher.publish()\n"
        "print('published', flush=True)\n"
        "time.sleep(30)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), DIR_ENV: str(tmp_path)}
    env.pop("LUCE_METRICS_OWNER", None)
    proc = subprocess.Popen([sys.executable, "-c", child], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "published"
        assert (tmp_path / f"{proc.pid}.json").exists()
        mine = MetricStore()
        mine.inc("pflash_prompts", outcome="compressed")
        text = exposition(mine)  # reads $LUCE_METRICS_DIR
        assert 'vllm:luce_kvflash_page_outs_total{rank="0"} 3.0' in text
        assert 'vllm:luce_pflash_prompts_total{outcome="compressed"} 1.0' in text
    finally:
        proc.kill()
        proc.wait()
    # A dead process's file is removed at the next read, its values gone with it.
    assert read_snapshots(str(tmp_path), os.getpid()) == []
    assert not (tmp_path / f"{proc.pid}.json").exists()


def test_publisher_writes_only_when_changed_and_skips_its_own_file(tmp_path, monkeypatch):
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    store = MetricStore()
    pub = Publisher(store)
    store.inc("dflash_drafts")
    pub.publish()
    path = tmp_path / f"{os.getpid()}.json"
    first = path.stat().st_mtime_ns
    pub.publish()  # unchanged: not rewritten
    assert path.stat().st_mtime_ns == first
    assert read_snapshots(str(tmp_path), os.getpid()) == []  # a process never reads itself twice
    assert read_snapshots(str(tmp_path), -1)[0]["counter"][0][0] == "dflash_drafts"


def test_flush_hands_the_latest_values_over_at_once_and_only_from_a_publishing_process(tmp_path, monkeypatch):
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    monkeypatch.setenv("LUCE_METRICS_OWNER", str(os.getpid()))
    owner = Publisher(MetricStore())
    owner.ensure_started()
    owner.store.inc("dflash_drafts")
    owner.flush()  # the serving process reads its own store: nothing written
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv("LUCE_METRICS_OWNER", "-1")
    store = MetricStore()
    pub = Publisher(store)
    store.set_total("kvflash_page_outs", 1, rank=0)
    pub.ensure_started()  # its thread writes now, then once a second
    while not (tmp_path / f"{os.getpid()}.json").exists():
        time.sleep(0.001)
    store.set_total("kvflash_page_outs", 7, rank=0)
    pub.flush()
    assert read_snapshots(str(tmp_path), -1)[0]["counter"] == [["kvflash_page_outs", [["rank", "0"]], 7.0]]


def test_every_metric_is_documented_with_its_kind():
    doc = (ROOT / "docs" / "reference.md").read_text()  # its table is generated (tests/test_docs.py)
    for name, (kind, labels, _) in CATALOG.items():
        row = re.search(rf"^\| `{re.escape(PREFIX + name)}(_total)?` \| {kind} \|.*$", doc, re.M)
        assert row, f"docs/reference.md lacks a row for {PREFIX + name} ({kind})"
        for label in labels:
            assert label in row.group(0), f"docs/reference.md: {name} does not mention its label {label}"
