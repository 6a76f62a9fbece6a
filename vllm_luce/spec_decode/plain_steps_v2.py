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
  a plain step then runs that part alone, eagerly. On vLLM 0.26 the speculator writes it eagerly, and
  ``dflash.plain_context_stash`` holds it for one pass later (``vllm_luce/vllm026/context_stash_v2.py``, bound
  after this, through ``PlainStep.before_step``).

V1 (hybrid targets) already skips the drafter (``patches/dflash_proposer_v1.py``); its plain steps still run
piecewise graphs (vLLM's V1 captures one decode length).
"""

from __future__ import annotations

from vllm_luce import hooks, overrides
from vllm_luce.log import logger, tag

TABLE_SETTING = "vllm.config.speculative:SpeculativeConfig.num_speculative_tokens_per_batch_size"


def graph_table(num_spec_tokens: int, max_num_seqs: int) -> list[tuple[int, int, int]]:
    """vLLM's dynamic-speculation table with draft lengths K (every real batch size) and 0 (past them)."""
    return [(1, max_num_seqs, num_spec_tokens), (max_num_seqs + 1, max_num_seqs + 1, 0)]


def v2_on_cuda(vllm_config) -> bool:
    """Model Runner V2 on CUDA without data parallelism (under which vLLM drops a draft-length table). vLLM 0.34 has
    no other runner and no ``use_v2_model_runner`` to ask."""
    from vllm.platforms import current_platform

    return current_platform.is_cuda() and bool(getattr(vllm_config, "use_v2_model_runner", True)) \
        and vllm_config.parallel_config.data_parallel_size == 1


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
    ``stash`` and ``before_step`` are None unless a binding after this one sets them (vLLM 0.26's drafter-context
    stash, ``vllm_luce/vllm026/context_stash_v2.py``): what it holds, and what it runs on each step's scheduler
    output before vLLM's ``execute_model``."""

    def __init__(self):
        self.plain = False
        self.skipped = 0  # drafter forwards skipped, for tests and the log
        self.stash = None
        self.before_step = None

    def note(self, scheduler_output) -> None:
        self.plain = getattr(scheduler_output, "num_spec_tokens_to_schedule", None) == 0

    def skip(self) -> bool:
        if self.plain:
            self.skipped += 1
        return self.plain


def bind_v2(runner, luce) -> PlainStep | None:
    """After V2's ``initialize_kv_cache``: a DFlash speculator under the gate skips its drafter on plain steps."""
    speculator = getattr(runner, "speculator", None)
    if not luce.dflash.gate or type(speculator).__name__ != "DFlashSpeculator":
        return None
    step = PlainStep()
    execute_model, generate_draft = runner.execute_model, speculator._generate_draft

    def execute_model_noting_plain_steps(scheduler_output, *args, **kwargs):
        if not kwargs.get("dummy_run"):
            step.note(scheduler_output)
            if step.before_step is not None:
                step.before_step(scheduler_output)
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
    runner.luce_plain_steps = step
    logger.info("%s: DFlash (Model Runner V2): plain steps write the drafter's context and skip its forward", tag())
    return step

