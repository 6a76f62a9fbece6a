"""KVFlash: a request's full-attention KV held to a pool of chunks, the cold ones paged out and the chunks its policy
selects brought back before the step that reads them (docs/kvflash.md).

Processes:
* the process that parses the configuration (the API server, or the offline ``LLM``'s): ``install.py`` validates the
  settings and switches vLLM's KV cache to KVFlash's spec, so a bad setting stops startup there;
* the engine client: ``frontend.py`` refuses a prompt whose paged-out KV could never fit host memory;
* the engine core's scheduler: ``spec.py`` (the KV cache spec and its manager), ``scheduler.py`` with ``decisions.py``
  (steps end at a paged request's decision positions) and ``engine_tiers.py`` with ``admission.py`` (where cold chunks
  go, whether a request may run);
* the workers: ``worker.py`` and its runner bindings ``worker_v1.py`` and ``worker_v2.py``, the per-worker
  ``runtime.py`` and what it runs (``pager.py``, ``kv_store.py``, ``pool_store.py``, ``host_pool.py``,
  ``policies.py``, ``sfi.py``, ``query_window.py``, ``cache_layout.py``, ``device_budget.py``; ``audit.py``, a
  diagnostic);
* ``host_ledger.py`` is shared through a file by every engine and worker on the host; ``settings.py`` is read by all,
  and every process derives the same plan from them with ``plan.py`` (``plan_of``).

Import rule (tests/test_layout.py): KVFlash is a feature, one layer above the base. It imports the base packages
(``config``, ``log``, ``metrics``, ``kernels``, ``hooks`` and the rest of the touch table, ``overrides``,
``request_args``, ``architectures``, ...); never another feature (``pflash``, ``spec_decode``), a seam or a binding
(``patches``, ``model_executor``, ``vllm026``, the entry points): PFlash's drafter reaches its scorer policy through
the seam ``scorer_policy``, whose hook row attaches it after both features are bound. A module of one model runner
alone ends in ``_v1`` or ``_v2`` and imports nothing of the other's; none branches on the vLLM series. Modules whose
docstring says pure import no vLLM.
"""
