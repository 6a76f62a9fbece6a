"""V1's ``_preprocess`` on the step ``gpu_model_runner_inputs`` prepared on the plain path: vLLM's own code
with the speculative config hidden (no placeholder clamp); every other step keeps vLLM's code.
(End to end, tests/e2e/test_dflash_gate.py checks greedy output while the gate switches modes.)"""

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm.v1.spec_decode.dflash")

from vllm_luce.patches import gpu_model_runner_preprocess as P  # noqa: E402


def run(marked: bool, fail: bool = False):
    spec = SimpleNamespace(name="dflash")
    so = SimpleNamespace()
    runner = SimpleNamespace(speculative_config=spec, _luce_draft_free_output=so if marked else SimpleNamespace())
    seen = []

    def original(self, scheduler_output, num_input_tokens, intermediate_tensors=None):
        seen.append((self.speculative_config, scheduler_output, num_input_tokens, intermediate_tensors))
        if fail:
            raise RuntimeError("boom")
        return "preprocessed"

    try:
        return P._make_wrapper(original)(runner, so, 8, "tensors"), seen, runner, spec, so
    except RuntimeError:
        return None, seen, runner, spec, so


def test_the_marked_step_runs_vllms_code_without_the_speculative_config():
    out, seen, runner, spec, so = run(marked=True)
    assert out == "preprocessed" and seen == [(None, so, 8, "tensors")] and runner.speculative_config is spec


def test_any_other_step_runs_vllms_code_as_it_is():
    out, seen, runner, spec, so = run(marked=False)
    assert out == "preprocessed" and seen == [(spec, so, 8, "tensors")]


def test_the_speculative_config_comes_back_when_vllms_code_raises():
    out, seen, runner, spec, _ = run(marked=True, fail=True)
    assert out is None and seen[0][0] is None and runner.speculative_config is spec
