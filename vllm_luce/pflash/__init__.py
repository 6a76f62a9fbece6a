"""PFlash: a long prompt scored by a small drafter and prefilled compressed to the chunks that matter
(docs/pflash.md).

Processes:
* the process that parses the configuration (the API server, or the offline ``LLM``'s): ``install.py`` checks the
  settings and the drafter checkpoint (``drafter_spec.py``) without loading weights, so a bad one stops startup;
* the engine client (API server or offline ``LLM``): ``frontend.py`` decides whether a prompt is compressed and swaps
  it for the kept tokens, ``client.py`` queues its scoring pass and waits for the answer, ``usage_report.py`` says in
  the response what PFlash did;
* the worker of rank 0, where the model runs: ``worker.py`` loads the drafter and binds ``service.py``, which scores
  (``scorer.py``, ``text_bridge.py`` where the vocabularies differ) and selects (``selection.py``);
* ``scoring_queue.py`` (the queue's state) is used on both sides; ``settings.py`` turns the configuration into the
  cores' configs.

Import rule (tests/test_layout.py): PFlash is a feature, one layer above the base. It imports the base packages
(``config``, ``log``, ``metrics``, ``kernels``, ``hooks``, ``overrides``, ``request_args``, ``checkpoint_headers``,
...); never another feature (``kvflash``, ``spec_decode``), a seam or a binding (``patches``, ``model_executor``,
``vllm026``, the entry points): what KVFlash takes from it goes through the seam ``scorer_policy``. None of its
modules branches on the vLLM series. Modules whose docstring says pure, or no vLLM import, import no vLLM.
"""
