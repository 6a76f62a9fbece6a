"""Plain steps on Model Runner V2 (``vllm_luce/spec_decode/plain_steps_v2.py``): the draft-length table that makes V2
capture one-token decode graphs, and a DFlash speculator that writes its context but runs no drafter on them."""

from types import SimpleNamespace

import pytest
import torch

from vllm_luce.config import LuceConfig, LuceConfigError
from vllm_luce.spec_decode import plain_steps_v2
from vllm_luce.spec_decode.install import install_gate


def vllm_config(v2=True, table=None, data_parallel=1):
    spec = SimpleNamespace(method="dflash", num_speculative_tokens=15, num_speculative_tokens_per_batch_size=table)
    return SimpleNamespace(speculative_config=spec, use_v2_model_runner=v2,
                           scheduler_config=SimpleNamespace(max_num_seqs=128, scheduler_cls=None, async_scheduling=True),
                           parallel_config=SimpleNamespace(data_parallel_size=data_parallel))


@pytest.fixture
def cuda(monkeypatch):
    import vllm.platforms

    monkeypatch.setattr(vllm.platforms, "current_platform", SimpleNamespace(is_cuda=lambda: True))


def test_the_table_has_draft_lengths_k_and_0_with_0_past_every_real_batch_size():
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    table = plain_steps_v2.graph_table(15, 128)
    assert {k for _, _, k in table} == {15, 0}
    assert set(build_dynamic_sd_schedule_lookup(table, 128, 15)[1:]) == {15}  # vLLM's own lookup never says 0


def test_the_gate_sets_the_table_on_v2_with_cuda_only(cuda):
    luce = LuceConfig.from_sources({}, {})
    config = vllm_config()
    assert install_gate(config, luce).endswith("LuceGatedAsyncScheduler")
    assert config.speculative_config.num_speculative_tokens_per_batch_size == plain_steps_v2.graph_table(15, 128)
    assert install_gate(config, luce)  # again (a copied config): its own table is no user table
    for other in (vllm_config(v2=False), vllm_config(data_parallel=2)):
        install_gate(other, luce)
        assert other.speculative_config.num_speculative_tokens_per_batch_size is None


def test_a_users_table_is_still_refused(cuda):
    with pytest.raises(LuceConfigError, match="num_speculative_tokens_per_batch_size"):
        install_gate(vllm_config(table=[(1, 128, 4)]), LuceConfig.from_sources({}, {}))


def scheduler_output(k, reqs=4, tokens=None, new=(), finished=(), preempted=None):
    return SimpleNamespace(num_spec_tokens_to_schedule=k, scheduled_new_reqs=list(new), finished_req_ids=set(finished),
                           preempted_req_ids=preempted, num_scheduled_tokens={f"r{i}": 1 for i in range(reqs)},
                           total_num_scheduled_tokens=reqs if tokens is None else tokens)


class DFlashSpeculator:
    """V2's propose as vLLM 0.26 orders it: the context write, then the drafter by graph replay or eagerly."""

    def __init__(self, graphs: bool):
        self.calls = []
        self.query_cudagraph_manager = SimpleNamespace(run_fullgraph=lambda desc: self.calls.append("graph")) \
            if graphs else None

    def _generate_draft(self, *args, **kwargs):
        self.calls.append("eager")

    def propose(self):
        self.calls.append("context")
        if self.query_cudagraph_manager is not None:
            self.query_cudagraph_manager.run_fullgraph("desc")
        else:
            self._generate_draft(1, 16, None, None, None)


@pytest.mark.parametrize("graphs", [True, False])
def test_a_plain_step_writes_the_drafters_context_and_runs_no_drafter(graphs):
    speculator = DFlashSpeculator(graphs)
    runner = SimpleNamespace(speculator=speculator, execute_model=lambda out, *a, **k: "executed",
                             vllm_config=vllm_config())
    step = plain_steps_v2.bind_v2(runner, LuceConfig.from_sources({}, {}))
    drafter = "graph" if graphs else "eager"
    for k, expected in ((15, ["context", drafter]), (0, ["context"]), (15, ["context", drafter])):
        speculator.calls.clear()
        assert runner.execute_model(scheduler_output(k)) == "executed"
        speculator.propose()
        assert speculator.calls == expected, k
    assert step.skipped == 1


def test_from_vllm_032_a_plain_step_runs_the_graphs_context_write_without_the_drafter():
    class Speculator032(DFlashSpeculator):
        def _prepare_graph_forward(self, num_reqs, attn_metadata):  # vLLM 0.32+: the graph's context step
            self.calls.append(("context step", num_reqs, attn_metadata))

        def propose(self):
            self.query_cudagraph_manager.run_fullgraph(SimpleNamespace(num_reqs=4))

    Speculator032.__name__ = "DFlashSpeculator"  # vLLM's class name, which bind_v2 looks for
    speculator = Speculator032(graphs=True)
    runner = SimpleNamespace(speculator=speculator, execute_model=lambda out, *a, **k: None, vllm_config=vllm_config())
    plain_steps_v2.bind_v2(runner, LuceConfig.from_sources({}, {}))
    for k, expected in ((15, ["graph"]), (0, [("context step", 4, None)])):
        speculator.calls.clear()
        runner.execute_model(scheduler_output(k))
        speculator.propose()
        assert speculator.calls == expected, k


def test_without_the_gate_or_a_dflash_speculator_nothing_is_bound():
    runner = SimpleNamespace(speculator=DFlashSpeculator(True), execute_model=lambda out: None)
    off = LuceConfig.from_sources({"luce": {"dflash": {"gate": False}}}, {})
    assert plain_steps_v2.bind_v2(runner, off) is None
    assert plain_steps_v2.bind_v2(SimpleNamespace(speculator=None), LuceConfig.from_sources({}, {})) is None


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
        luce = LuceConfig.from_sources({"luce": {"dflash": {"plain_context_stash": stash}}}, {})
        plain_steps_v2.bind_v2(runner, luce)
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
    step = plain_steps_v2.PlainStep()
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
        assert install_gate(vllm_config(v2=v2), luce)
        return
    where = "Model Runner V2 on CUDA" if not v2 else f"vLLM 0.26 \\(this is vLLM {series}\\)"
    with pytest.raises(LuceConfigError, match=f"dflash.plain_context_stash=64: applies to {where}"):
        install_gate(vllm_config(v2=v2), luce)


@pytest.mark.parametrize("series", ["0.26", "0.32"])
@pytest.mark.parametrize("v2", [True, False])
def test_the_default_stash_is_1024_tokens_where_it_applies_and_off_elsewhere(cuda, monkeypatch, series, v2):
    import vllm_luce.compat

    monkeypatch.setattr(vllm_luce.compat, "installed_series", lambda: series)
    luce = LuceConfig.from_sources({}, {})
    assert luce.dflash.plain_context_stash == "auto"
    assert install_gate(vllm_config(v2=v2), luce)  # never refused
    runner = SimpleNamespace(speculator=DFlashSpeculator_(ContextModel(), per_layer=False),
                             execute_model=lambda out, *a, **k: None, vllm_config=vllm_config(v2=v2))
    stash = plain_steps_v2.bind_v2(runner, luce).stash
    assert (stash.capacity if stash else 0) == (1024 if v2 and series == "0.26" else 0)


def test_a_step_that_copies_cache_blocks_first_writes_what_the_stash_holds():
    """A partial prefix hit copies a cached block into a new one before the step's forward: the block must
    already hold its plain steps' context."""
    model = ContextModel()
    speculator = DFlashSpeculator_(model, per_layer=False)
    seen = []
    runner = SimpleNamespace(speculator=speculator, execute_model=lambda out, *a, **k: seen.append(model.cache.clone()))
    plain_steps_v2.bind_v2(runner, LuceConfig.from_sources({"luce": {"dflash": {"plain_context_stash": 64}}}, {}))
    features, positions, slots = torch.ones(4, 6), torch.arange(4), torch.arange(4) * 100
    runner.execute_model(scheduler_output(0))
    speculator.propose(features, positions, slots)
    assert model.passes == 0  # stashed
    copies = scheduler_output(0, new=("n",))
    copies.kv_cache_block_copies = [SimpleNamespace(src_block_id=0, dst_block_id=1)]
    runner.execute_model(copies)
    assert model.passes == 1 and seen[-1][0, slots].abs().sum() > 0  # written before the step ran
