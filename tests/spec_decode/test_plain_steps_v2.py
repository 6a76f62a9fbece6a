"""Plain steps on Model Runner V2 (``vllm_luce/spec_decode/plain_steps_v2.py``): the draft-length table that makes V2
capture one-token decode graphs, and a DFlash speculator that writes its context but runs no drafter on them."""

from types import SimpleNamespace

import pytest

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
    assert install_gate(config, luce).summary.endswith("LuceGatedAsyncScheduler")
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
