"""Luce model executors: vLLM's model classes plus the attachment points of the features (docs/executors.md).

Processes:
* every vLLM process at ``register()``: ``registry.py`` registers the executors and the DFlash drafter class with
  vLLM's ModelRegistry;
* the workers: the model is built and run there (``executor.py``, ``models/``, and ``layer_plan.py``, the per-layer
  plan the features attach to).

Import rule (tests/test_layout.py): a binding, the top layer. It may import the base packages, the features and the
seams (today ``architectures``, ``config``, ``hooks``, ``log`` and ``kvflash``); nothing below imports it but the
other bindings (``patches``, the entry point ``vllm_luce``), and no package may import itself back. A module of one
model runner alone ends in ``_v1`` or ``_v2``; none branches on the vLLM series.
"""
