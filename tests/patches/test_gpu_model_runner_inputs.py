"""The V1 runner's plain input path for draft-free steps: vLLM's own ``_prepare_inputs`` with the
speculative config hidden, then the Gated DeltaNet draft counts vLLM sets for a step without drafts.
(End to end, tests/e2e/test_dflash_gate.py checks greedy output while the gate switches modes.)"""

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("vllm.v1.spec_decode.dflash")

from vllm_luce.patches import gpu_model_runner_inputs as P  # noqa: E402


class Counts:
    def __init__(self, n):
        self.np = np.full(n, 7, dtype=np.int32)  # stale values of an earlier step
        self.copies = 0

    def copy_to_gpu(self):
        self.copies += 1


def make(*, drafts=None, mode="none", plain=True, recurrent=True):
    spec = SimpleNamespace(name="dflash")
    runner = SimpleNamespace(_luce_reads_draft_counts=recurrent,
        speculative_config=spec, cache_config=SimpleNamespace(mamba_cache_mode=mode),
        num_decode_draft_tokens=Counts(6), num_accepted_tokens=SimpleNamespace(np=np.ones(6, dtype=np.int32)),
        input_batch=SimpleNamespace(num_reqs=4, num_computed_tokens_cpu=np.array([30, 12, 9, 40]),
                                    num_prompt_tokens=np.array([20, 12, 10, 40])))
    so = SimpleNamespace(scheduled_spec_decode_tokens=drafts or {}, num_spec_tokens_to_schedule=0)
    return runner, so, spec, plain


def run(runner, so, plain, monkeypatch, fail=False, scheduled=(1, 5, 1, 1)):
    monkeypatch.setattr(P, "holds_plain_step", lambda r, s: plain)
    seen = []

    def original(self, scheduler_output, num_scheduled_tokens):
        seen.append(self.speculative_config)
        if fail:
            raise RuntimeError("boom")
        return "inputs"

    out = P._make_wrapper(original)(runner, so, np.array(scheduled))
    return out, seen


def test_draft_counts_follow_vllms_rule_for_a_step_without_drafts():
    counts = P.zero_draft_decode_counts(np.array([30, 12, 9, 40, 3]), np.array([20, 12, 10, 40, 8]),
                                        np.array([1, 5, 1, 1, 5]))
    # decode rows 0; a prompt chunk, even one token long (row 2), -1
    assert counts.tolist() == [0, -1, -1, 0, -1] and counts.dtype == np.int32


def test_a_draft_free_step_runs_vllms_code_without_the_speculative_config(monkeypatch):
    runner, so, spec, plain = make()
    out, seen = run(runner, so, plain, monkeypatch)
    assert out == "inputs" and seen == [None] and runner.speculative_config is spec
    assert runner.num_decode_draft_tokens.np.tolist() == [0, -1, -1, 0, -1, -1]
    assert runner.num_decode_draft_tokens.copies == 1


def test_the_speculative_config_comes_back_when_vllms_code_raises(monkeypatch):
    runner, so, spec, plain = make()
    with pytest.raises(RuntimeError, match="boom"):
        run(runner, so, plain, monkeypatch, fail=True)
    assert runner.speculative_config is spec and P.draft_free_output(runner) is None


def test_the_plain_path_marks_its_step_for_the_later_patches_and_any_other_step_clears_it(monkeypatch):
    runner, so, spec, plain = make()
    assert P.draft_free_output(runner) is None  # before any step
    run(runner, so, plain, monkeypatch)
    assert P.draft_free_output(runner) is so
    drafting = SimpleNamespace(scheduled_spec_decode_tokens={"r": [5]}, num_spec_tokens_to_schedule=0)
    run(runner, drafting, plain, monkeypatch)
    assert P.draft_free_output(runner) is None


@pytest.mark.parametrize("change", [dict(drafts={"r": [5, 6]}), dict(mode="align"), dict(plain=False)])
def test_steps_with_drafts_or_other_paths_keep_vllms_code(monkeypatch, change):
    runner, so, spec, plain = make(**change)
    out, seen = run(runner, so, plain, monkeypatch)
    assert out == "inputs" and seen == [spec]
    assert runner.num_decode_draft_tokens.np.tolist() == [7] * 6 and runner.num_decode_draft_tokens.copies == 0


def test_empty_draft_lists_count_as_draft_free(monkeypatch):
    runner, so, spec, plain = make(drafts={"r": []})
    _, seen = run(runner, so, plain, monkeypatch)
    assert seen == [None]


@pytest.mark.parametrize("plain_decode, accepted, scheduled, computed, want", [
    (True, [1, 1, 1], [1, 1, 1], [30, 12, 40], [-1, -1, -1]),  # all decoding, no offset: no speculative row
    (True, [1, 3, 1], [1, 1, 1], [30, 12, 40], [0, 0, 0]),  # a row accepted drafts: its state sits at an offset
    (True, [1, 1, 1], [1, 5, 1], [30, 12, 40], [0, -1, 0]),  # a prompt row: vLLM's rule
    (False, [1, 1, 1], [1, 1, 1], [30, 12, 40], [0, 0, 0]),  # no plain decode on the non-speculative path
])
def test_gdn_counts_leave_the_speculative_path_only_where_no_row_needs_it(plain_decode, accepted, scheduled,
                                                                           computed, want):
    counts = P.gdn_draft_counts(np.array(computed), np.array([20, 12, 40]), np.array(scheduled), np.array(accepted),
                                plain_decode)
    assert counts.tolist() == want and counts.dtype == np.int32


def test_an_all_decode_step_without_offsets_takes_the_plain_gdn_path_where_it_decodes_plainly(monkeypatch):
    for active, want in ((True, [-1] * 6), (False, [0, 0, 0, 0, -1, -1])):
        runner, so, spec, plain = make()
        runner.input_batch.num_computed_tokens_cpu = np.array([30, 12, 10, 40])  # every row past its prompt
        monkeypatch.setattr(P.cpu_gdn_nonspec, "ACTIVE", active)
        run(runner, so, plain, monkeypatch, scheduled=(1, 1, 1, 1))
        assert runner.num_decode_draft_tokens.np.tolist() == want


def test_targets_without_recurrent_layers_skip_the_draft_counts(monkeypatch):
    runner, so, spec, plain = make(recurrent=False)
    out, seen = run(runner, so, plain, monkeypatch)
    assert out == "inputs" and seen == [None] and runner.num_decode_draft_tokens.copies == 0


def test_only_vllms_recurrent_state_builders_read_the_draft_counts():
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    def runner(*builders):
        groups = [[SimpleNamespace(get_metadata_builder=lambda b=b: b) for b in builders]]
        return SimpleNamespace(attn_groups=groups)

    gdn = GDNAttentionMetadataBuilder.__new__(GDNAttentionMetadataBuilder)
    assert P.reads_draft_counts(runner(object(), gdn)) and not P.reads_draft_counts(runner(object()))
