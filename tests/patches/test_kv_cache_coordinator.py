"""The memoized ``replay_boundaries``: vLLM's answers, computed once per distinct arguments, and reached by
the coordinator's ``cache_blocks``."""

import pytest


@pytest.fixture(scope="module")
def coordinator_module():
    import vllm_luce

    vllm_luce.register()
    from vllm.v1.core import kv_cache_coordinator

    from vllm_luce.patches import kv_cache_coordinator as patch

    patch.apply()  # normally on first import of vllm.v1.core.kv_cache_coordinator
    return kv_cache_coordinator


def test_answers_are_vllms(coordinator_module):
    cached = coordinator_module.replay_boundaries
    original = cached.__wrapped__
    assert cached is not original
    for use_eagle in (False, True):
        for block in (1, 16, 64):
            for n in range(0, 300, 7):
                assert cached(n, block, use_eagle=use_eagle) == original(n, block, use_eagle=use_eagle)


def test_a_repeated_call_is_not_recomputed(coordinator_module):
    cached = coordinator_module.replay_boundaries
    cached(1237, 16, use_eagle=True)
    hits = cached.cache_info().hits
    assert cached(1237, 16, use_eagle=True) == (1216,)  # the aligned block below 1232, as vLLM answers
    assert cached.cache_info().hits == hits + 1


def test_apply_is_idempotent(coordinator_module):
    from vllm_luce.patches import kv_cache_coordinator as patch

    before = coordinator_module.replay_boundaries
    assert patch.apply() is False
    assert coordinator_module.replay_boundaries is before


def test_the_coordinator_calls_the_module_function(coordinator_module):
    """cache_blocks looks the name up in its module at call time, so the cached one is what it runs."""
    code = coordinator_module.KVCacheCoordinator.cache_blocks.__code__
    assert "replay_boundaries" in code.co_names
