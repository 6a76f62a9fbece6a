import importlib

import pytest

from vllm_luce.architectures import EXECUTORS, executors_mode


def test_executors_mode_from_the_environment():
    assert executors_mode({}) == "auto"
    assert executors_mode({"VLLM_LUCE_EXECUTORS": "OFF"}) == "off"
    with pytest.raises(ValueError, match="VLLM_LUCE_EXECUTORS='sometimes'; expected one of auto, off"):
        executors_mode({"VLLM_LUCE_EXECUTORS": "sometimes"})


@pytest.mark.parametrize("architecture", sorted(EXECUTORS))
def test_each_executor_subclasses_the_vllm_class_it_replaces(architecture):
    from vllm.model_executor.models.registry import _VLLM_MODELS

    module_name, class_name = EXECUTORS[architecture].split(":")
    executor = getattr(importlib.import_module(module_name), class_name)
    upstream_module, upstream_class = _VLLM_MODELS[architecture]
    upstream = getattr(importlib.import_module(f"vllm.model_executor.models.{upstream_module}"),
                       upstream_class)
    assert issubclass(executor, upstream) and executor.upstream_architecture == architecture


def test_executors_answer_to_the_upstream_class_name_and_pickle_by_their_own():
    """vLLM dispatches on model.__class__.__name__ (0.26's DFlash proposer on multimodal targets): an executor
    answers with its upstream class's name; __qualname__ (pickling, logs) keeps its own."""
    import importlib
    import pickle

    from vllm_luce.architectures import EXECUTORS

    for architecture, path in EXECUTORS.items():
        module, name = path.split(":")
        cls = getattr(importlib.import_module(module), name)
        assert (cls.__name__, cls.__qualname__) == (architecture, name)
        assert pickle.loads(pickle.dumps(cls)) is cls
