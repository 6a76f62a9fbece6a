"""LuceExecutor: the mixin that turns a vLLM model class into a vllm-luce executor.

`class LuceX(LuceExecutor, X)` runs vLLM's own `X.__init__` and forward unchanged, so with
every feature off the output is vLLM's, token for token. On top it parses the LuceConfig,
builds the model's LayerPlan (the attachment point of KVFlash, DFlash and PFlash) and logs
which executor serves the model, since vLLM's own override log is debug-only.
"""

from __future__ import annotations

from vllm_luce import hooks
from vllm_luce.config import LuceConfig
from vllm_luce.log import logger, tag
from vllm_luce.model_executor.layer_plan import LINEAR, LayerInfo, LayerPlan, layer_info_from_attention


def build_layer_plan(model) -> LayerPlan:
    """One LayerInfo per decoder layer that holds attention or a Gated DeltaNet (Mamba-style) state."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.mamba.abstract import MambaBase
    from vllm.model_executor.models.utils import extract_layer_index

    found: dict[int, LayerInfo] = {}
    for name, module in model.named_modules():
        if isinstance(module, Attention):
            info = layer_info_from_attention(extract_layer_index(name), name, module)
        elif isinstance(module, MambaBase):
            info = LayerInfo(index=extract_layer_index(name), kind=LINEAR, module_name=name)
        else:
            continue
        if info.index in found:
            raise ValueError(f"two attention modules in decoder layer {info.index}: "
                             f"{found[info.index].module_name} and {name}")
        found[info.index] = info
    return LayerPlan(tuple(found[i] for i in sorted(found)))


def pool_full_attention(model, plan: LayerPlan, luce: LuceConfig, vllm_config) -> None:
    """KVFlash: the full-attention layers that own their KV declare a KVFlashSpec (a per-request
    pool, KVFlash's plan's resident cap); sliding-window, KV-sharing and Gated DeltaNet layers keep vLLM's own specs."""
    from vllm_luce.kvflash.plan import plan_of
    from vllm_luce.kvflash.spec import KVFlashSpec
    pool_tokens = plan_of(luce, vllm_config).resident_cap_tokens
    cold_rows = bool(pool_tokens) and luce.kvflash.gpu_cold  # rows with room for cold chunks in free blocks
    modules = dict(model.named_modules())
    for info in plan.full_attention:
        attn = modules[info.module_name]
        upstream = attn.get_kv_cache_spec

        def get_kv_cache_spec(vllm_config, _upstream=upstream):
            return KVFlashSpec.from_full_attention(_upstream(vllm_config), pool_tokens, cold_rows)

        hooks.bind("vllm.model_executor.layers.attention:Attention.get_kv_cache_spec", attn, get_kv_cache_spec)


class LuceExecutor:
    """Mixed in before the vLLM model class; keeps its constructor signature and defaults."""

    upstream_architecture: str = ""

    def __init_subclass__(cls, **kwargs):
        """An executor answers to its upstream class's ``__name__``: vLLM dispatches on
        ``model.__class__.__name__`` (vLLM 0.26's DFlash proposer reads a multimodal target's image token by
        it, and fails on any other name, such as LuceQwen3_5ForConditionalGeneration). Its own name stays in ``__qualname__``,
        which pickling and the logs use."""
        super().__init_subclass__(**kwargs)
        upstream = next((b for b in cls.__mro__[1:] if b.__module__.startswith("vllm.")), None)
        if upstream is not None:
            hooks.bind("vllm.model_executor.models:<upstream model class>.__name__", cls, upstream.__name__)

    def __init__(self, *, vllm_config, prefix: str | None = None) -> None:
        # vLLM recognises model classes by the `vllm_config`/`prefix` keywords; an omitted prefix
        # keeps the upstream class's own default (it differs between classes).
        if prefix is None:
            super().__init__(vllm_config=vllm_config)
        else:
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.luce_config = LuceConfig.from_vllm_config(vllm_config)
        self.luce_layers = build_layer_plan(self)
        if self.luce_config.kvflash.enabled:
            pool_full_attention(self, self.luce_layers, self.luce_config, vllm_config)
        logger.info("%s: %s is served by %s (%s); features: %s", tag(), self.upstream_architecture,
                    type(self).__qualname__, self.luce_layers.summary(), self.luce_config.describe())
