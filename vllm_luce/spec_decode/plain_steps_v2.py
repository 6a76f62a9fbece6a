"""Plain steps as cheap as vLLM without speculation, on Model Runner V2 (the GPU default for dense targets).

A plain step is one where the gate asked for no drafts (``num_spec_tokens_to_schedule`` 0). Inside a DFlash engine
such a step costs more than a step of vLLM without speculation, for two reasons this module removes
(docs/benchmarks.md, "DFlash: output tokens/s by concurrency"):

* **Graphs.** V2 captures full CUDA graphs for decode batches of ``1 + K`` tokens per request only, so a batch of
  one token per request ran piecewise (attention outside the graph). V2 also captures one graph set per draft
  length of vLLM's dynamic-speculation table; ``graph_table`` is a table whose lengths are K and 0, so V2 captures
  both. The gate stands in for the table's lookup (``scheduler.py``), so only its lengths matter: the 0 sits on
  batch sizes past ``max_num_seqs``, which never occur.
* **The drafter.** V2 proposes after every step. Its DFlash speculator first writes the drafter's context K/V from
  the step's target features, then runs the drafter on a block of query slots and samples drafts. After a plain
  step nobody verifies those drafts: under asynchronous scheduling the next step has no draft slots, and the
  scheduler drops them otherwise (``scheduler.py``). ``bind_v2`` keeps the context write, so the drafter's KV stays
  complete for when speculation resumes, and skips the drafter's forward (eager or graph replay) on such steps.
  From vLLM 0.32 the drafter's full graph writes a decode step's context itself (its ``_prepare_graph_forward``);
  a plain step then runs that part alone, eagerly.
* **The context write, vLLM 0.26:** ``dflash.plain_context_stash`` (on by default there) holds plain steps'
  context inputs and writes them in one pass later (``bind_context_stash``, ``context_stash.py``): it recovers
  most of what a plain step costs beyond vLLM alone (docs/benchmarks.md, "DFlash: output tokens/s by concurrency").

V1 (hybrid targets) already skips the drafter (``patches/dflash_proposer_v1.py``); its plain steps still run
piecewise graphs (vLLM's V1 captures one decode length).
"""

from __future__ import annotations

from typing import Any

from vllm_luce import hooks, overrides
from vllm_luce.config import LuceConfigError
from vllm_luce.log import logger, tag
from vllm_luce.spec_decode.context_stash import ContextStash

TABLE_SETTING = "vllm.config.speculative:SpeculativeConfig.num_speculative_tokens_per_batch_size"


def graph_table(num_spec_tokens: int, max_num_seqs: int) -> list[tuple[int, int, int]]:
    """vLLM's dynamic-speculation table with draft lengths K (every real batch size) and 0 (past them)."""
    return [(1, max_num_seqs, num_spec_tokens), (max_num_seqs + 1, max_num_seqs + 1, 0)]


def v2_on_cuda(vllm_config) -> bool:
    """Model Runner V2 on CUDA without data parallelism (under which vLLM drops a draft-length table)."""
    from vllm.platforms import current_platform

    return current_platform.is_cuda() and bool(vllm_config.use_v2_model_runner) \
        and vllm_config.parallel_config.data_parallel_size == 1


AUTO_CONTEXT_STASH = 1024  # tokens, 40 MB at Qwen3-8B-DFlash's shape (docs/dflash.md, "Limits")


def context_stash_tokens(setting: int | str, vllm_config: Any) -> int:
    """``dflash.plain_context_stash`` resolved: ``auto`` is ``AUTO_CONTEXT_STASH`` where the stash applies and 0
    elsewhere; a number where it does not apply is refused. It applies to Model Runner V2 on CUDA with vLLM 0.26,
    whose DFlash speculator writes the drafter's context eagerly (from 0.32 the drafter's CUDA graph writes a
    decode step's context)."""
    if not setting:
        return 0
    from vllm_luce.compat import installed_series

    if not v2_on_cuda(vllm_config):
        where = "Model Runner V2 on CUDA"
    elif (series := installed_series()) != "0.26":
        where = f"vLLM 0.26 (this is vLLM {series})"
    else:
        return AUTO_CONTEXT_STASH if setting == "auto" else setting
    if setting == "auto":
        return 0
    raise LuceConfigError(f"dflash.plain_context_stash={setting}: applies to {where}; set it to 0 or leave it out")


def set_graph_table(vllm_config) -> bool:
    """On a CUDA engine whose runner is V2: the table above, so that V2 captures one-token decode graphs. The table
    a user set is refused earlier (``install.py``); one set here before (a copied config) is left as it is."""
    if not v2_on_cuda(vllm_config):
        return False
    spec = vllm_config.speculative_config
    table = graph_table(spec.num_speculative_tokens, vllm_config.scheduler_config.max_num_seqs)
    if spec.num_speculative_tokens_per_batch_size != table:
        overrides.warn(overrides.GATE_GRAPH_TABLE, spec.num_speculative_tokens_per_batch_size, table)
        hooks.bind(TABLE_SETTING, spec, table)
    return True


class PlainStep:
    """Whether the step the runner is executing asked for no drafts: set by ``execute_model``, read by the
    speculator later in the same step (V2 runs a step's ``execute_model`` then its ``sample_tokens``).
    ``stashable``: a plain step of one token per request in which no request started, finished or was preempted,
    so no cache block changed hands since the step before."""

    def __init__(self, stash: ContextStash | None = None):
        self.plain = False
        self.stashable = False
        self.stash = stash  # with dflash.plain_context_stash
        self.skipped = 0  # drafter forwards skipped, for tests and the log

    def note(self, scheduler_output) -> None:
        out = scheduler_output
        self.plain = getattr(out, "num_spec_tokens_to_schedule", None) == 0
        self.stashable = self.plain and not out.scheduled_new_reqs and not out.finished_req_ids \
            and not out.preempted_req_ids and out.total_num_scheduled_tokens == len(out.num_scheduled_tokens)

    def skip(self) -> bool:
        if self.plain:
            self.skipped += 1
        return self.plain


def bind_v2(runner, luce) -> PlainStep | None:
    """After V2's ``initialize_kv_cache``: a DFlash speculator under the gate skips its drafter on plain steps."""
    speculator = getattr(runner, "speculator", None)
    if not luce.dflash.gate or type(speculator).__name__ != "DFlashSpeculator":
        return None
    setting = luce.dflash.plain_context_stash  # a number was checked at startup; auto resolves the same way here
    stash = setting if isinstance(setting, int) else context_stash_tokens(setting, runner.vllm_config)
    step = PlainStep(ContextStash(stash) if stash else None)
    execute_model, generate_draft = runner.execute_model, speculator._generate_draft
    write_stash = None  # with the stash: writes what it holds (bind_context_stash, below)

    def execute_model_noting_plain_steps(scheduler_output, *args, **kwargs):
        if not kwargs.get("dummy_run"):
            step.note(scheduler_output)
            if write_stash is not None and getattr(scheduler_output, "kv_cache_block_copies", None):
                write_stash()  # the step first copies cache blocks (a partial prefix hit): complete them
        return execute_model(scheduler_output, *args, **kwargs)

    def generate_draft_unless_plain(*args, **kwargs):
        if not step.skip():
            generate_draft(*args, **kwargs)

    hooks.bind("vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model", runner,
               execute_model_noting_plain_steps)
    hooks.bind("vllm.v1.worker.gpu.spec_decode.dflash.speculator:DFlashSpeculator._generate_draft", speculator,
               generate_draft_unless_plain)
    manager = getattr(speculator, "query_cudagraph_manager", None)
    if manager is not None:
        run_fullgraph = manager.run_fullgraph

        context_step = getattr(speculator, "_prepare_graph_forward", None)  # vLLM 0.32+: the graph's first part

        def run_fullgraph_unless_plain(desc):
            if not step.skip():
                return run_fullgraph(desc)
            if context_step is not None:  # the graph writes the step's context: write it without the drafter
                context_step(desc.num_reqs, None)
            return None

        hooks.bind("vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.run_fullgraph", manager,
                   run_fullgraph_unless_plain)
    if step.stash is not None:
        write_stash = bind_context_stash(speculator, step)
    runner.luce_plain_steps = step
    logger.info("%s: DFlash (Model Runner V2): plain steps %s the drafter's context and skip its forward", tag(),
                f"stash (up to {stash} tokens)" if stash else "write")
    return step


def bind_context_stash(speculator, step: PlainStep):
    """A stashable step's context features, positions and slots go to ``step.stash`` instead of the drafter's
    cache; any other context write first writes what the stash holds (``context_stash.py``). Returns the function
    that writes it."""
    stash, model = step.stash, speculator.model
    combine, precompute = model.combine_hidden_states, model.precompute_and_store_context_kv
    hidden_size = speculator.hidden_states.shape[-1]

    def combine_or_stage(hidden_states):
        if step.stashable and stash.stage(hidden_states):
            return hidden_states[:, :hidden_size]  # propose copies it into a buffer that no plain step reads
        return combine(hidden_states)

    def precompute_or_commit(context_states, context_positions, context_slot_mapping=None):
        slots = context_slot_mapping
        if stash.staged and slots is not None and not (isinstance(slots, list) and any(s is None for s in slots)):
            return stash.commit(context_positions, slots)
        if stash.staged:  # staged, but this write cannot be kept: compute the features it replaced
            context_states = combine(stash.staged_features())[:context_states.shape[0]]
            stash.unstage()
        if slots is not None:  # a dummy run's pass writes nothing: what the stash holds stays
            write_held()
        return precompute(context_states, context_positions, context_slot_mapping)

    def write_held():
        held = stash.drain()
        if held is not None:
            features, positions, slots = held
            precompute(combine(features), positions, slots)

    hooks.bind("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.combine_hidden_states", model,
               combine_or_stage)
    hooks.bind("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.precompute_and_store_context_kv",
               model, precompute_or_commit)
    return write_held
