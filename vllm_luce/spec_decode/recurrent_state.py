"""Where a hybrid target's recurrent state (Gated DeltaNet, Mamba) is after a verify step, which rows vLLM would read
it from the wrong place, and moving it to where they read (pure torch: no vLLM import).

A speculating engine keeps each request's recurrent state in the first 1 + K slots of its block-table row. A verify
step of q tokens writes the state after its i-th token to slot i and appends its conv inputs to the conv window of
slot 0; the next verify step resumes from slot a - 1 and reads the conv window at offset a - 1, where a is the
number of tokens the step kept (its accepted drafts and the token sampled after them). vLLM's V1 runner reads there
only for a row that verified in the step just before; it reads slot 0 and offset 0, the right state only when
a == 1, for:

* a row back in the batch after a step away (the scheduler's token budget left it out): V1 drops it from the
  persistent batch and adds it back as new, with one kept token;
* on vLLM 0.26, a decode row without drafts after a verify step (0.32 sends it through the verify path).

``rows_to_realign`` finds those rows; ``realign`` moves each one's state to slot 0 and offset 0, after which reading
it as one kept token (what the binding then tells vLLM) is right on every series. vLLM 0.26's Model Runner V2 keeps
each request's count across batch changes but reads slot 0 for a decode row without drafts too (its binding:
``vllm_luce/vllm026/recurrent_state_v2.py``); ``state_layers`` finds the layers for both runners.
"""

from __future__ import annotations

from typing import AbstractSet, Any, Callable, Mapping, Sequence

import torch

# A Gated DeltaNet layer's (conv state, ssm state, conv window (kernel width - 1), KV cache group)
StateLayer = tuple[torch.Tensor, torch.Tensor, int, int]


def state_layers(groups: Sequence[Any], forward_context: Mapping[str, Any],
                 is_recurrent: Callable[[Any], bool]) -> list[StateLayer]:
    """The Gated DeltaNet layers of a runner's KV cache groups (``kv_cache_config.kv_cache_groups``) whose spec
    ``is_recurrent`` (vLLM's MambaSpec): the layers of ``forward_context`` with a conv kernel and two state tensors."""
    layers = []
    for group_id, group in enumerate(groups):
        if not is_recurrent(group.kv_cache_spec):
            continue
        for name in group.layer_names:
            layer = forward_context[name]
            if hasattr(layer, "conv_kernel_size") and len(layer.kv_cache) == 2:
                conv, ssm = layer.kv_cache
                layers.append((conv, ssm, layer.conv_kernel_size - 1, group_id))
    return layers


def rows_to_realign(previous: AbstractSet[str], verified: Mapping[str, bool], req_ids: Sequence[str],
                    drafts_now: Mapping[str, Sequence]) -> list[int]:
    """The batch rows whose request verified drafts in its latest step (``verified``) and that vLLM will not read
    at slot a - 1: back after a step away (not in the ``previous`` step), or without drafts now."""
    return [row for row, req_id in enumerate(req_ids)
            if verified.get(req_id) and (req_id not in previous or not drafts_now.get(req_id))]


def realign(conv: torch.Tensor, ssm: torch.Tensor, slots: torch.Tensor, accepted: torch.Tensor, window: int,
            conv_dim_first: bool) -> None:
    """Move each row's recurrent state in place to where a decode step without drafts reads it: ``ssm`` slot 0 of
    the row takes slot a - 1, and the conv window at offset 0 (``window`` = kernel width - 1 inputs) takes the
    window at offset a - 1.

    ``conv``: [blocks, dim, state_len] (``conv_dim_first``) or [blocks, state_len, dim]; ``ssm``: [blocks, ...];
    ``slots``: the rows' block-table rows, [rows, >= 1 + K]; ``accepted``: a per row (>= 1, as the engine counts
    it after a verify step; 1 after a step without drafts, which leaves the row as it is)."""
    shift = (accepted.to(torch.long) - 1).clamp(min=0)
    slots = slots.to(torch.long)
    dst, src = slots[:, 0], slots.gather(1, shift[:, None]).squeeze(1)
    ssm.index_copy_(0, dst, ssm.index_select(0, src))
    state = conv.index_select(0, dst)
    positions = shift[:, None] + torch.arange(window, device=conv.device)
    if conv_dim_first:
        state[:, :, :window] = state.gather(2, positions[:, None, :].expand(-1, state.size(1), -1))
    else:
        state[:, :window, :] = state.gather(1, positions[:, :, None].expand(-1, -1, state.size(2)))
    conv.index_copy_(0, dst, state)
