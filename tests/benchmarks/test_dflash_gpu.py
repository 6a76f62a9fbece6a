"""benchmarks/dflash_gpu.py's table: each engine's ratio to no speculation and gated's to the better of none and fixed,
with the goals it misses."""

import json
from types import SimpleNamespace

import benchmarks.dflash_gpu as bench
from benchmarks.dflash_gpu import expand_split, luce_config, table, variant_switch


def engine(*rates):
    return {"cells": [{"concurrency": c, "tokens_per_s": r} for c, r in zip((1, 4), rates)]}


def test_ratios_are_to_no_speculation_and_gated_to_the_better_of_none_and_fixed():
    results = {"none": engine(100, 400), "control": engine(102, 396), "gated@0.9": engine(500, 1200),
               "fixed@0.9": engine(520, 1200), "gated@0.0": engine(98, 380), "fixed@0.0": engine(70, 200)}
    rows, misses = table(results, [0.0, 0.9], [1, 4])
    assert [r["gated/best"] for r in rows] == [0.98, 0.95, round(5.0 / 5.2, 3), 1.0]
    assert rows[0]["control/none"] == 1.02 and rows[1]["fixed/none"] == 0.5
    assert misses == ["p=0.0 c=4: gated 0.95x the better of none and fixed",
                      "p=0.9 c=1: gated 0.962x the better of none and fixed"]


def test_rows_carry_each_modes_median_step_and_the_bare_diagnostic():
    def timed(rate, ms):
        return {"cells": [{"concurrency": 1, "tokens_per_s": rate, "median_step_ms": ms}]}

    results = {"none": timed(100, 5.0), "gated@0.0": timed(97, 5.15), "bare@0.0": timed(99, 5.05)}
    (row,), _ = table(results, [0.0], [1])
    assert row["bare/none"] == 0.99 and row["gated/none"] == 0.97
    assert row["median_step_ms"] == {"none": 5.0, "gated": 5.15, "bare": 5.05}


def test_bare_skips_the_speculator_on_plain_steps_only():
    from types import SimpleNamespace

    import pytest

    from benchmarks.dflash_gpu import skip_speculator_on_plain_steps

    calls = []
    speculator = SimpleNamespace(draft_tokens=[[7], [8], [9]], propose=lambda batch, *a, **k: calls.append(k) or "new")
    step = SimpleNamespace(plain=True)
    state = skip_speculator_on_plain_steps(SimpleNamespace(model_runner=SimpleNamespace(luce_plain_steps=step,
                                                                                        speculator=speculator)))
    batch = SimpleNamespace(num_reqs=2)
    assert speculator.propose(batch) == [[7], [8]] and calls == []
    assert speculator.propose(batch, dummy_run=True) == "new"
    step.plain = False
    assert speculator.propose(batch) == "new" and len(calls) == 2
    step.plain, state.on = True, False  # switched off: plain steps propose again
    assert speculator.propose(batch) == "new" and len(calls) == 3
    with pytest.raises(SystemExit, match="Model Runner V2"):
        skip_speculator_on_plain_steps(SimpleNamespace(model_runner=SimpleNamespace(speculator=speculator)))


def test_each_plugin_mode_sets_the_gate_and_only_unstashed_sets_the_stash():
    assert luce_config("gated") == luce_config("bare") == luce_config("split") == {"luce": {"dflash": {"gate": True}}}
    assert luce_config("ungated") == {"luce": {"dflash": {"gate": False}}}
    assert luce_config("unstashed") == {"luce": {"dflash": {"gate": True, "plain_context_stash": 0}}}


def test_a_split_engine_switches_its_variants_and_reports_each_as_an_engine():
    from vllm_luce.spec_decode.plain_steps_v2 import PlainStep
    from vllm_luce.vllm026.context_stash import ContextStash

    step = PlainStep()
    step.stash = ContextStash(1024)  # as vLLM 0.26's binding sets it
    step.plain = True
    calls = []
    speculator = SimpleNamespace(draft_tokens=[[7]], propose=lambda batch, *a, **k: calls.append(1) or "proposed")
    worker = SimpleNamespace(model_runner=SimpleNamespace(luce_plain_steps=step, speculator=speculator))
    executor = SimpleNamespace(driver_worker=SimpleNamespace(worker=worker))
    llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(
        engine_core=SimpleNamespace(model_executor=executor))))
    switch = variant_switch(llm, "split")
    batch = SimpleNamespace(num_reqs=1)
    for variant, capacity, proposes in (("gated", 1024, True), ("unstashed", 0, True), ("bare", 0, False)):
        switch(variant)
        calls.clear()
        assert step.stash.capacity == capacity, variant
        assert (speculator.propose(batch) == "proposed") is proposes and bool(calls) is proposes, variant

    cells = [{"concurrency": 1, "tokens_per_s": 1.0}]
    results = expand_split({"none": {"name": "none", "cells": cells},
                            "split@0.0": {"name": "split@0.0", "gate": "g", "variants": {
                                v: {"cells": cells} for v in ("gated", "unstashed", "bare")}}})
    assert sorted(results) == ["bare@0.0", "gated@0.0", "none", "unstashed@0.0"]
    assert results["unstashed@0.0"] == {"cells": cells, "gate": "g", "name": "unstashed@0.0",
                                        "engine": "split@0.0"}


def test_a_card_per_level_runs_its_baseline_first_and_its_ratios_are_to_it(monkeypatch, tmp_path):
    specs = [{"name": n, "level": level} for n, level in
             (("none@0.0", 0.0), ("none@0.9", 0.9), ("none", None), ("control", None), ("fixed@0.0", 0.0),
              ("fixed@0.9", 0.9), ("gated@0.0", 0.0), ("gated@0.9", 0.9))]
    ran = {}  # level -> (gpu, name) in the order run

    def run_child(spec, workdir, gpu, timeout, resume):
        ran.setdefault(spec["level"], []).append((gpu, spec["name"]))
        return {"name": spec["name"]}

    monkeypatch.setattr(bench, "run_child", run_child)
    assert sorted(bench.run_all(specs, tmp_path, 4, 1.0, card_per_level=True)) == sorted(s["name"] for s in specs)
    assert [name for _, name in ran[0.0]] == ["none@0.0", "fixed@0.0", "gated@0.0"]
    assert [name for _, name in ran[None]] == ["none", "control"]
    assert all(len({gpu for gpu, _ in card}) == 1 for card in ran.values())  # a level's engines share a card
    results = {"none": engine(100, 400), "control": engine(101, 400), "none@0.0": engine(90, 360),
               "gated@0.0": engine(88.2, 360), "fixed@0.0": engine(60, 200)}
    results["none"]["cells"][0]["median_step_ms"], results["none@0.0"]["cells"][0]["median_step_ms"] = 5.0, 5.5
    rows, _ = table(results, [0.0], [1, 4])
    assert rows[0]["none_tok_s"] == 90 and rows[0]["gated/none"] == 0.98 and rows[0]["control/none"] == 1.01
    assert rows[0]["median_step_ms"] == {"none": 5.5}  # the level's own card's step, as its rate


def test_resume_keeps_what_an_earlier_call_measured_for_the_same_spec_only(monkeypatch, tmp_path):
    spec = {"name": "gated@0.9", "plugins": True, "mode": "gated"}
    (tmp_path / "gated-0.9.json").write_text(json.dumps(spec))
    (tmp_path / "gated-0.9.out.json").write_text(json.dumps({"cells": [1]}))
    runs = []
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: runs.append(a) or SimpleNamespace(returncode=1))
    assert bench.run_child(spec, tmp_path, None, 1.0, resume=True) == {"cells": [1], "name": "gated@0.9"}
    assert runs == []
    changed = bench.run_child({**spec, "mode": "ungated"}, tmp_path, None, 1.0, resume=True)
    assert len(runs) == 1 and changed["error"] == "exit 1" and not (tmp_path / "gated-0.9.out.json").exists()
    bench.run_child(spec, tmp_path, None, 1.0)  # without resume: measured again
    assert len(runs) == 2
