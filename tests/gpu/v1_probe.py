"""Instruments an in-process Model Runner V1 engine for `tests/gpu/test_kvflash_dflash_v1.py` (issue 67; goes with
the fix): each scheduler step's schedule and kept tokens, the recurrent-state realigner's moves, every DFlash drafter
slot that falls outside its request's blocks of the drafter's KV cache group, every change to the pooled K and V of
a computed token of a request that never paged, and vllm-luce's V1 pieces switched off one at a time (``off``:
"realigner", "plain" (the plain-step patch), "widths" (verify widths), "rowview" (the KVFlash pagers get copies of
the block table's rows, as on Model Runner V2)). Test-only: it rebinds vLLM and vllm-luce methods in the engine's
process."""

from __future__ import annotations

import numpy as np

STEPS: list[dict] = []  # per scheduler step: scheduled tokens, drafts, kept tokens ("out") by request
MOVES: list[list] = []  # [step, requests the realigner moved]
STRAY: list[list] = []  # [step, "ctx" or "query", batch row, slot, the row's blocks]
KV_CHANGED: list[list] = []  # [step, request, tokens checked]: pooled K/V of a never-paged request's computed tokens
MISPLACED: list[list] = []  # [step, request, first position, tokens, resident length]: a never-paged request's step
# written elsewhere than at its positions, or attention told another length
_KV_SEEN: dict[str, tuple[int, float, float]] = {}
CHECKS = [0]  # drafter first passes checked
_RUNNER: list = []
_STEP_OF: dict[int, int] = {}
_CURRENT = [-1]


def install(llm, settings: dict) -> None:
    _trace_scheduler(llm.llm_engine.engine_core.engine_core.scheduler)
    llm.collective_rpc(bind_runner)
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_luce.kvflash.runtime import KVFlashRuntime
    from vllm_luce.patches.recurrent_state_v1 import Realigner

    off = set(settings.get("off", ()))
    if "plain" in off:
        DFlashProposer.propose = DFlashProposer.propose.__wrapped__
    if "widths" in off:
        GPUModelRunner.take_draft_token_ids = GPUModelRunner.take_draft_token_ids.__wrapped__
    _check_kept_kv(KVFlashRuntime, copy_rows="rowview" in off)
    if "realigner" in off:
        Realigner.of = classmethod(lambda cls, runner: None)
    before, move = Realigner.before_forward, Realigner._move

    def before_forward(self, runner, scheduler_output):
        _CURRENT[0] = _STEP_OF.get(id(scheduler_output), -1)
        return before(self, runner, scheduler_output)

    def _move(self, runner, rows):
        MOVES.append([_CURRENT[0], [runner.input_batch.req_ids[r] for r in rows]])
        return move(self, runner, rows)

    Realigner.before_forward, Realigner._move = before_forward, _move
    _check_drafter_slots(DFlashProposer)


def _trace_scheduler(sched) -> None:
    schedule, update = sched.schedule, sched.update_from_output

    def traced_schedule(*args, **kwargs):
        out = schedule(*args, **kwargs)
        _STEP_OF[id(out)] = len(STEPS)
        STEPS.append({"n": {r: int(n) for r, n in out.num_scheduled_tokens.items()},
                      "spec": {r: len(t) for r, t in (out.scheduled_spec_decode_tokens or {}).items()}})
        return out

    def traced_update(scheduler_output, model_runner_output):
        step = _STEP_OF.get(id(scheduler_output))
        sampled = getattr(model_runner_output, "sampled_token_ids", None)
        if step is not None and sampled is not None:
            STEPS[step]["out"] = {r: len(t) for r, t in zip(model_runner_output.req_ids, sampled)}
        return update(scheduler_output, model_runner_output)

    sched.schedule, sched.update_from_output = traced_schedule, traced_update


def bind_runner(worker) -> None:
    _RUNNER.append(worker.model_runner)


def _check_kept_kv(runtime_class, copy_rows: bool) -> None:
    """Each step, once the pagers planned it, for every request that never paged: the pooled layers' K and V of the
    tokens computed by its previous step are what they were then (a checksum; a sync per request, test-only), and
    this step's tokens go to the slots of their positions with attention reading all of them. A never-paged pool
    holds position p at offset p, so ``store.slots`` of positions are their slots. ``copy_rows``: the pagers get
    copies of the block table's rows instead of views."""
    import torch

    plan = runtime_class.plan

    def checksum(store, tokens: int) -> tuple[float, float]:
        data = store._read_slots(torch.from_numpy(store.slots(np.arange(tokens))).to(store.device)).double()
        return float(data.sum()), float((data * data).sum())

    def checked_plan(self, req_ids, query_start_loc, starts, rows, num_blocks, num_prompt_tokens):
        if copy_rows:
            rows, num_blocks = rows.copy(), num_blocks.copy()
        slots = plan(self, req_ids, query_start_loc, starts, rows, num_blocks, num_prompt_tokens)
        for r, req_id in enumerate(req_ids):
            pager, tokens = self.pagers[req_id], int(starts[r])
            if pager.stats.page_outs:
                continue
            seen = _KV_SEEN.get(req_id)
            if seen is not None and checksum(pager.store, seen[0]) != seen[1:]:
                KV_CHANGED.append([len(STEPS) - 1, req_id, seen[0]])
            lo, hi = int(query_start_loc[r]), int(query_start_loc[r + 1])
            placed = np.array_equal(slots[lo:hi], pager.store.slots(np.arange(tokens, tokens + hi - lo)))
            if not placed or int(self.resident_lens[r]) != tokens + hi - lo:
                MISPLACED.append([len(STEPS) - 1, req_id, tokens, hi - lo, int(self.resident_lens[r])])
            if tokens:
                _KV_SEEN[req_id] = (tokens, *checksum(pager.store, tokens))
        return slots

    runtime_class.plan = checked_plan


def _check_drafter_slots(proposer_class) -> None:
    """After vLLM's DFlash first pass computes the context and query slots from the drafter group's block table,
    every slot lies in its request's blocks of that group (a sync; test-only)."""
    first_pass = proposer_class.set_inputs_first_pass

    def checked(self, target_token_ids, next_token_ids, target_positions, target_hidden_states,
                token_indices_to_sample, cad, num_rejected_tokens_gpu):
        out = first_pass(self, target_token_ids, next_token_ids, target_positions, target_hidden_states,
                         token_indices_to_sample, cad, num_rejected_tokens_gpu)
        table = _RUNNER[0].input_batch.block_table[self.kv_cache_gid]
        context, batch = target_token_ids.shape[0], cad.batch_size()
        rows = np.searchsorted(cad.query_start_loc_cpu.numpy()[1:], np.arange(context), side="right")
        per = 1 + self.num_speculative_tokens
        queries = self._slot_mapping_buffer[: batch * per]
        for kind, slots, owners in (("ctx", self._context_slot_mapping_buffer[:context], rows),
                                    ("query", queries, np.repeat(np.arange(batch), per))):
            for slot, row in zip(slots.cpu().tolist(), owners.tolist()):
                mine = table.block_table.np[row, : int(table.num_blocks_per_row[row])]
                if slot >= 0 and slot // self.block_size not in mine and len(STRAY) < 200:
                    STRAY.append([len(STEPS) - 1, kind, row, slot, mine.tolist()])
        CHECKS[0] += 1
        return out

    proposer_class.set_inputs_first_pass = checked


def groups(worker) -> dict:
    """The runner's KV cache groups (spec, block size, layers) and the drafter's group and block size."""
    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None)
    return {"groups": [{"spec": type(g.kv_cache_spec).__name__, "block": g.kv_cache_spec.block_size,
                        "layers": list(g.layer_names)} for g in runner.kv_cache_config.kv_cache_groups],
            "drafter_group": getattr(drafter, "kv_cache_gid", None),
            "drafter_block": getattr(drafter, "block_size", None)}


def report(llm) -> dict:
    return {"steps": STEPS, "moves": MOVES, "stray": STRAY, "checks": CHECKS[0], "kv_changed": KV_CHANGED,
            "misplaced": MISPLACED, "kv_tracked": len(_KV_SEEN), "groups": llm.collective_rpc(groups)}
