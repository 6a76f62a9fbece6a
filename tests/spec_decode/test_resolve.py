"""`--speculative-model dflash` resolution and drafter/target guards (pure, no vLLM)."""

import json
from types import SimpleNamespace

import pytest

from vllm_luce.patches.engine_args import apply_dflash_defaults
from vllm_luce.spec_decode import resolve as R

TARGET_TEXT = {"vocab_size": 4096, "hidden_size": 256, "num_hidden_layers": 8,
               "rope_parameters": {"rope_type": "default", "rope_theta": 1e7}}
DRAFTER = {"architectures": ["DFlashDraftModel"], "vocab_size": 4096, "hidden_size": 256, "block_size": 16,
           "rope_theta": 1e7, "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 4, 6]}}


def make_drafter(path, **changes):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({**DRAFTER, **changes}))
    return path


@pytest.fixture
def target(tmp_path):
    t = tmp_path / "models" / "Qwen3-8B"
    t.mkdir(parents=True)
    (t / "config.json").write_text("{}")
    return t


def resolve(target, env=None):
    return R.resolve_drafter("dflash", str(target), env or {"HF_HUB_CACHE": "/nonexistent"})


def test_path_or_repo_id_is_used_as_given(target):
    assert R.resolve_drafter("z-lab/Qwen3-8B-DFlash-b16", str(target), {}) == R.ResolvedDrafter(
        "z-lab/Qwen3-8B-DFlash-b16", "given")


def test_next_to_the_target_comes_first(target):
    make_drafter(target.parent / "Qwen3-8B-DFlash-b16")
    beside = make_drafter(target / "dflash")
    assert resolve(target) == R.ResolvedDrafter(str(beside), "next to the target")


def test_sibling_named_after_the_target(target):
    make_drafter(target.parent / "Qwen3-8B-DFlash-b16")
    (target.parent / "Qwen3-8B-DFlash-a").mkdir()  # sorted first but not a drafter: skipped
    assert resolve(target).path == str(target.parent / "Qwen3-8B-DFlash-b16")


def test_environment_variable_after_the_target_directory(target, tmp_path):
    drafter = make_drafter(tmp_path / "elsewhere")
    got = resolve(target, {R.DRAFTER_ENV: str(drafter), "HF_HUB_CACHE": "/nonexistent"})
    assert got == R.ResolvedDrafter(str(drafter), f"${R.DRAFTER_ENV}")


def test_environment_variable_must_name_a_drafter(target, tmp_path):
    with pytest.raises(R.DrafterNotFound, match="is not a DFlash drafter directory"):
        resolve(target, {R.DRAFTER_ENV: str(tmp_path), "HF_HUB_CACHE": "/nonexistent"})


def test_zlab_name_in_the_hf_cache(tmp_path):
    cache = tmp_path / "hub"
    repo = cache / "models--z-lab--Qwen3-8B-DFlash-b16"
    make_drafter(repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    # The target itself is a repository id (not a local directory), as `vllm serve Qwen/Qwen3-8B` gives.
    got = R.resolve_drafter("dflash", "Qwen/Qwen3-8B", {"HF_HUB_CACHE": str(cache)})
    assert got.path == str(repo / "snapshots" / "abc123")
    assert "models--z-lab--Qwen3-8B-DFlash-b16" in got.source


def test_target_name_from_cache_snapshot_path():
    assert R.target_name("/c/hub/models--Qwen--Qwen3.6-27B/snapshots/deadbeef") == "Qwen3.6-27B"
    assert R.target_name("Qwen/Qwen3-8B") == "Qwen3-8B"
    assert R.target_name("/models/my-target/") == "my-target"


def test_failure_lists_every_place_tried_in_order(target, tmp_path):
    with pytest.raises(R.DrafterNotFound) as err:
        R.resolve_drafter("dflash", str(target), {"HF_HUB_CACHE": str(tmp_path / "hub")})
    msg = str(err.value)
    places = [f"{target}/dflash/", "Qwen3-8B-DFlash*", f"${R.DRAFTER_ENV} (unset)",
              f"{tmp_path / 'hub'}/models--z-lab--Qwen3-8B-DFlash*"]
    positions = [msg.index(p) for p in places]
    assert positions == sorted(positions), msg


def test_default_token_count_is_block_size_minus_one():
    assert R.default_num_speculative_tokens(DRAFTER) == 15
    assert R.default_num_speculative_tokens({"dflash_config": {"block_size": 8}}) == 7
    with pytest.raises(R.DrafterMismatch, match="block_size"):
        R.default_num_speculative_tokens({})


@pytest.mark.parametrize("change, expected", [
    ({"vocab_size": 1024}, "vocab_size: drafter 1024 vs target 4096"),
    ({"hidden_size": 512}, "hidden_size: drafter 512 vs target 256"),
    ({"rope_theta": 1e6}, "rope_theta: drafter 1e+06 vs target 1e+07"),
    ({"dflash_config": {"target_layer_ids": [1, 4, 8]}}, "[8] outside 0..7"),
])
def test_mismatched_drafter_names_both_values(change, expected):
    with pytest.raises(R.DrafterMismatch) as err:
        R.check_drafter_matches_target({**DRAFTER, **change}, TARGET_TEXT, "/d", "/t")
    assert expected in str(err.value) and "/d" in str(err.value) and "/t" in str(err.value)


def test_layer_id_is_the_output_of_layer_i():
    """Id L-1 (the last layer's output) is usable: vLLM captures output i after layer i runs."""
    R.check_drafter_matches_target({**DRAFTER, "dflash_config": {"target_layer_ids": [0, 7]}}, TARGET_TEXT, "/d", "/t")
    with pytest.raises(R.DrafterMismatch, match=r"\[-1\] outside"):
        R.check_drafter_matches_target({**DRAFTER, "dflash_config": {"target_layer_ids": [-1]}},
                                       TARGET_TEXT, "/d", "/t")


def test_nested_rope_parameters_of_gemma4_are_read():
    gemma = {**TARGET_TEXT, "rope_parameters": {"full_attention": {"rope_theta": 1e6},
                                                "sliding_attention": {"rope_theta": 1e4}}}
    with pytest.raises(R.DrafterMismatch, match="rope_theta: drafter 1e\\+07 vs target 1e\\+06"):
        R.check_drafter_matches_target(DRAFTER, gemma, "/d", "/t")


def engine_args(**kw):
    base = dict(speculative_config=None, spec_model=None, spec_method=None, spec_tokens=None,
                max_num_seqs=64)  # the user's: the draft-slot fit (tested below) leaves it
    return SimpleNamespace(**{**base, **kw})


def test_flag_form_fills_method_and_tokens(target):
    drafter = make_drafter(target / "dflash")
    args = engine_args(spec_model="dflash")
    apply_dflash_defaults(args, str(target), TARGET_TEXT)
    assert (args.spec_model, args.spec_method, args.spec_tokens) == (str(drafter), "dflash", 15)
    assert args.speculative_config is None


def test_config_form_keeps_what_the_user_set(target):
    drafter = make_drafter(target / "dflash")
    args = engine_args(speculative_config={"model": "dflash", "num_speculative_tokens": 4})
    apply_dflash_defaults(args, str(target), TARGET_TEXT)
    assert args.speculative_config == {"model": str(drafter), "method": "dflash", "num_speculative_tokens": 4}


def test_other_methods_are_left_alone(target):
    args = engine_args(speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    assert apply_dflash_defaults(args, str(target), TARGET_TEXT) is None
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 4}
    with pytest.raises(R.DrafterMismatch, match="method is 'eagle3'"):
        apply_dflash_defaults(engine_args(spec_model="dflash", spec_method="eagle3"), str(target), TARGET_TEXT)


def test_a_drafter_path_is_checked_against_the_target(target, tmp_path):
    drafter = make_drafter(tmp_path / "wrong", vocab_size=151936)
    with pytest.raises(R.DrafterMismatch, match="vocab_size: drafter 151936 vs target 4096"):
        apply_dflash_defaults(engine_args(spec_model=str(drafter)), str(target), TARGET_TEXT)


class _Args:
    """What fit_draft_slots reads of EngineArgs, with H100-class defaults."""
    tensor_parallel_size = pipeline_parallel_size = 1

    def __init__(self, max_num_seqs=None, max_num_batched_tokens=None, batch_defaults=None):
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self._defaults = batch_defaults or ({"llm": 16384, "serve": 8192}, {"llm": 1024, "serve": 1024})

    def get_batch_defaults(self, world_size):
        return self._defaults


@pytest.mark.parametrize("args, k, fitted", [
    (_Args(), 15, (256, 14)),  # vllm serve's 8192 - 14 x 1024 < 0: 256 requests, slots half the budget
    (_Args(max_num_batched_tokens=32768), 15, None),  # 32768 - 14 x 1024 > 0 everywhere
    (_Args(max_num_seqs=1024), 15, None),  # the user's choice stays (vLLM's own check then speaks)
    (_Args(), 1, None),  # one token: no parallel slots
    (_Args(batch_defaults=({"llm": 4096, "serve": 2048}, {"llm": 256, "serve": 128})), 15, None),  # CPU: fits
    (_Args(batch_defaults=({"llm": 8192, "serve": 2048}, {"llm": 256, "serve": 256})), 15, (64, 14)),  # smaller GPUs
])
def test_dflash_fits_its_draft_slots_in_the_step_budget(args, k, fitted):
    from vllm_luce.patches.engine_args import fit_draft_slots

    assert fit_draft_slots(args, k) == fitted
    if fitted:
        assert args.max_num_seqs == fitted[0]
