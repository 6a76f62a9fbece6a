"""DFlash: speculative decoding with a block drafter, under a gate that speculates only where it pays
(docs/dflash.md).

Processes:
* the process that parses the configuration (the API server, or the offline ``LLM``'s): ``install.py`` points vLLM's
  scheduler at the gated one; ``resolve.py`` finds the drafter for ``--speculative-model dflash`` and
  ``gguf_drafter.py`` reads a GGUF drafter (also for ``vllm-luce convert-drafter``);
* the engine core's scheduler: ``scheduler.py`` binds the gate (``gate.py``) and publishes its report
  (``gate_report.py``);
* the workers: the drafter model (``drafter.py``), the adaptive verify width and non-finite guard
  (``verify_width.py``), plain steps on Model Runner V2 (``plain_steps_v2.py``), and the hybrid target's recurrent
  state after a verify step (``recurrent_state.py``, bound by the patches and by ``vllm026``).

Import rule (tests/test_layout.py): DFlash is a feature, one layer above the base. It imports the base packages
(``config``, ``log``, ``metrics``, ``hooks``, ``overrides``, ``request_args``, ``checkpoint_headers``, ...); never
another feature (``kvflash``, ``pflash``), nor a binding (``patches``, ``model_executor``, ``vllm026``, the entry
points): the gated scheduler with KVFlash's mixin is the seam ``schedulers``. A module of one model runner alone ends
in ``_v1`` or ``_v2`` and imports nothing of the other's; none branches on the vLLM series. Modules whose docstring
says pure, or no vLLM import, import no vLLM.
"""
