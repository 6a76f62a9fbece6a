"""vLLM 0.26's plain-context stash on Model Runner V2 (``vllm_luce/vllm026/context_stash_v2.py``), bound after the
plain steps (``tests/spec_decode/test_plain_steps_v2.py``) as the hook table orders them: the drafter reads the cache
that writing every step gives, what may be stashed, and where the stash is refused or off."""

from types import SimpleNamespace

import pytest
import torch

from tests.spec_decode.test_plain_steps_v2 import cuda, scheduler_output, vllm_config  # noqa: F401 (a fixture)
from vllm_luce import hooks
from vllm_luce.config import LuceConfig, LuceConfigError
from vllm_luce.vllm026 import context_stash_v2

V2_KV_CACHE = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.initialize_kv_cache"


def bind_as_v2_does(runner, luce):
    """DFlash's rows after Model Runner V2's initialize_kv_cache, in the table's order (the plain steps, the stash,
    then the recurrent state's realigner, which a runner without a hybrid target skips), as the initialize_kv_cache
    patch runs them; the plain steps' state."""
    rows = [h for h in hooks.features(target=V2_KV_CACHE) if h.feature == "DFlash"]
    assert [h.owners[0].rsplit(".", 1)[1] for h in rows] == ["plain_steps_v2:bind_v2", "context_stash_v2:bind_v2",
                                                             "recurrent_state_v2:bind_v2"]
    for row in rows:
        row.function()(runner, luce)
    return runner.luce_plain_steps


def after_checks(config, luce):
    """DFlash's rows after vLLM's config checks, in the table's order (the gate, then the stash's check), as the
    VllmConfig patch runs them; the gate's scheduler class."""
    rows = [h for h in hooks.features(hooks.AFTER_CHECKS) if h.feature == "DFlash"]
    assert [h.owners[0].rsplit(".", 1)[1] for h in rows] == ["install:install_gate", "context_stash_v2:check_setting"]
    return [row.function()(config, luce) for row in rows][0]


class ContextModel:
    """A drafter whose context write puts ``features @ fc + position + layer`` in each layer's cache row ``slot``
    (integer values: exact whatever rows a pass gets)."""

    def __init__(self, layers=3, width=6, hidden=4, cache_rows=512):
        self.fc = torch.randint(-3, 4, (width, hidden), generator=torch.Generator().manual_seed(0)).float()
        self.cache = torch.zeros(layers, cache_rows, hidden)
        self.passes = 0

    def combine_hidden_states(self, hidden_states):
        return hidden_states @ self.fc

    def precompute_and_store_context_kv(self, context_states, context_positions, context_slot_mapping=None):
        if context_slot_mapping is None:
            return
        self.passes += 1
        rows = context_slot_mapping if isinstance(context_slot_mapping, list) else [context_slot_mapping] * 3
        for layer, slots in enumerate(rows):
            keep = slots >= 0
            self.cache[layer, slots[keep]] = context_states[keep] + context_positions[keep, None] + layer


class ContextSpeculator:
    """V2's propose as vLLM 0.26 orders the context write: combine the padded features, copy the step's rows into
    a buffer, write their context; then the drafter (which reads the cache) unless the step is plain."""

    def __init__(self, model, per_layer):
        self.model, self.per_layer = model, per_layer
        self.hidden_states = torch.zeros(32, model.fc.shape[1])
        self.query_cudagraph_manager = None
        self.seen = []  # the cache each drafter forward read

    def _generate_draft(self, *args, **kwargs):
        self.seen.append(self.model.cache.clone())

    def propose(self, features, positions, slots, dummy_run=False):
        tokens = positions.shape[0]
        combined = self.model.combine_hidden_states(features)
        self.hidden_states[:tokens].copy_(combined[:tokens])
        context_slots = None if dummy_run else [slots, slots, slots + 1] if self.per_layer else slots
        self.model.precompute_and_store_context_kv(self.hidden_states[:tokens], positions, context_slots)
        self._generate_draft()


class DFlashSpeculator_(ContextSpeculator):
    pass


DFlashSpeculator_.__name__ = "DFlashSpeculator"


def steps(seed):
    """A run of steps: (scheduler output, padded features, positions, slots, dummy run); requests r0-r3 decode at
    positions counting up, in cache rows of their own (no row changes hands); some steps start or finish requests,
    carry a prefill chunk, a padding slot or a dummy run."""
    gen = torch.Generator().manual_seed(seed)
    position = torch.tensor([3, 9, 14, 20])
    for i in range(60):
        kind = torch.randint(0, 10, (1,), generator=gen).item()
        k = 15 if kind < 2 else 0
        tokens = 4 + (3 if kind == 2 else 0)  # a prefill chunk rides along
        out = scheduler_output(k, tokens=tokens, finished=("r9",) if kind == 3 else (), new=("n",) if kind == 4 else ())
        pad = tokens + (i % 3)
        features = torch.randint(-2, 3, (pad, 6), generator=gen).float()
        positions = torch.cat([position, torch.arange(40, 40 + tokens - 4)])
        slots = positions + torch.tensor([0, 100, 200, 300, 400, 400, 400])[:tokens]  # rows of each request's own
        slots[-1] = -1 if kind == 5 else slots[-1]  # a padding slot vLLM skips
        position = position + 1
        yield out, features, positions, slots, kind == 6


@pytest.mark.parametrize("per_layer", [False, True])
@pytest.mark.parametrize("capacity", [9, 16, 1000])
def test_a_stash_leaves_the_drafter_reading_the_cache_every_step_writing_gives(per_layer, capacity):
    runs = []
    for stash in (0, capacity):
        model = ContextModel()
        speculator = DFlashSpeculator_(model, per_layer)
        runner = SimpleNamespace(speculator=speculator, execute_model=lambda out, *a, **k: None)
        bind_as_v2_does(runner, LuceConfig.from_sources({"luce": {"dflash": {"plain_context_stash": stash}}}, {}))
        for out, features, positions, slots, dummy in steps(1):
            runner.execute_model(out, dummy_run=dummy)
            speculator.propose(features, positions, slots, dummy_run=dummy)
        runner.execute_model(scheduler_output(15))  # a drafting step ends the run
        speculator.propose(*next(steps(2))[1:4])
        runs.append((speculator.seen, model.cache, model.passes))
    (every_step, cache, passes), (stashed, stashed_cache, stashed_passes) = runs
    assert len(every_step) == len(stashed) > 5
    assert all(torch.equal(a, b) for a, b in zip(every_step, stashed))
    assert torch.equal(cache, stashed_cache)
    assert stashed_passes < passes


def test_only_plain_decode_steps_where_no_block_changes_hands_are_stashable():
    step = context_stash_v2.StashableStep()
    cases = {"plain decode": (scheduler_output(0), True), "drafting": (scheduler_output(15), False),
             "a prefill rides along": (scheduler_output(0, tokens=9), False),
             "a request starts": (scheduler_output(0, new=("n",)), False),
             "a request finished": (scheduler_output(0, finished=("f",)), False),
             "a request was preempted": (scheduler_output(0, preempted={"p"}), False)}
    for name, (out, stashable) in cases.items():
        step.note(out)
        assert step.stashable is stashable, name


@pytest.mark.parametrize("series", ["0.26", "0.32", "0.33"])
@pytest.mark.parametrize("v2", [True, False])
def test_the_stash_is_refused_at_startup_where_the_speculator_does_not_write_the_context_eagerly(
        cuda, monkeypatch, series, v2):
    import vllm_luce.compat

    monkeypatch.setattr(vllm_luce.compat, "installed_series", lambda: series)
    luce = LuceConfig.from_sources({"luce": {"dflash": {"plain_context_stash": 64}}}, {})
    if v2 and series == "0.26":
        assert after_checks(vllm_config(v2=v2), luce)
        return
    where = "Model Runner V2 on CUDA" if not v2 else f"vLLM 0.26 \\(this is vLLM {series}\\)"
    with pytest.raises(LuceConfigError, match=f"dflash.plain_context_stash=64: applies to {where}"):
        after_checks(vllm_config(v2=v2), luce)


@pytest.mark.parametrize("series", ["0.26", "0.32"])
@pytest.mark.parametrize("v2", [True, False])
def test_the_default_stash_is_1024_tokens_where_it_applies_and_off_elsewhere(cuda, monkeypatch, series, v2):
    import vllm_luce.compat

    monkeypatch.setattr(vllm_luce.compat, "installed_series", lambda: series)
    luce = LuceConfig.from_sources({}, {})
    assert luce.dflash.plain_context_stash == "auto"
    assert after_checks(vllm_config(v2=v2), luce)  # never refused
    runner = SimpleNamespace(speculator=DFlashSpeculator_(ContextModel(), per_layer=False),
                             execute_model=lambda out, *a, **k: None, vllm_config=vllm_config(v2=v2))
    stash = bind_as_v2_does(runner, luce).stash
    assert (stash.capacity if stash else 0) == (1024 if v2 and series == "0.26" else 0)


def test_a_step_that_copies_cache_blocks_first_writes_what_the_stash_holds():
    """A partial prefix hit copies a cached block into a new one before the step's forward: the block must
    already hold its plain steps' context."""
    model = ContextModel()
    speculator = DFlashSpeculator_(model, per_layer=False)
    seen = []
    runner = SimpleNamespace(speculator=speculator, execute_model=lambda out, *a, **k: seen.append(model.cache.clone()))
    bind_as_v2_does(runner, LuceConfig.from_sources({"luce": {"dflash": {"plain_context_stash": 64}}}, {}))
    features, positions, slots = torch.ones(4, 6), torch.arange(4), torch.arange(4) * 100
    runner.execute_model(scheduler_output(0))
    speculator.propose(features, positions, slots)
    assert model.passes == 0  # stashed
    copies = scheduler_output(0, new=("n",))
    copies.kv_cache_block_copies = [SimpleNamespace(src_block_id=0, dst_block_id=1)]
    runner.execute_model(copies)
    assert model.passes == 1 and seen[-1][0, slots].abs().sum() > 0  # written before the step ran
