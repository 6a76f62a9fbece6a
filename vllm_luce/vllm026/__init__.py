"""vLLM 0.26 only: the code vllm-luce runs for vLLM 0.26 and for no later series, in one package.

* ``context_stash.py`` (pure) and ``context_stash_v2.py`` (its binding to Model Runner V2):
  ``dflash.plain_context_stash``, the DFlash gate's plain steps holding the drafter's context inputs and writing them
  in one pass. vLLM 0.26's V2 DFlash speculator writes that context eagerly on every step; from 0.32 the drafter's
  CUDA graph writes it.
* ``recurrent_state_v2.py``: on Model Runner V2 with a hybrid target, a decode row without drafts after its
  request's verify step reads the Gated DeltaNet state of that step's last kept token. vLLM 0.26 reads slot 0 there;
  from 0.32 such rows take the verify path, which reads the state in place.
* ``spec_rows_first_v1.py``: on Model Runner V1 with a hybrid target, the rows that verify drafts come first in the
  batch. vLLM 0.26's Gated DeltaNet layer gives them the gates of the batch's first tokens; from 0.32 their own.

Processes: the workers, where the bindings patch Model Runner V1 and V2 (``context_stash.py`` is the stash's pure
core); ``context_stash_v2.check_setting`` also runs in the process that parses the configuration, so a setting the
stash cannot serve stops startup.

Import rule (tests/test_layout.py): a binding, the top layer; it may import the base packages, the features and
the other bindings (today ``compat``, ``config``, ``hooks``, ``hook_ledger``, ``log``, ``patches`` and ``spec_decode``).
Nothing outside this package imports it or compares the vLLM series with 0.26. It is reached
only through rows of vllm_luce/hooks.py whose removal condition names vLLM 0.26; the feature installs resolve the
stash to nothing on later series.

Dropping vLLM 0.26 is deleting this package, tests/vllm026/ and those hook rows; then the
configuration key ``dflash.plain_context_stash`` (config.py's SCHEMA, dry_run.py, docs), "0.26" from compat.py's
series, the 0.26 records of the per-series signatures (hook_ledger.py's ``per_series``, hook_signatures.py's
``PER_SERIES``) and tests/patches/vllm_signatures/0.26.0.json (tests/test_compat.py names the other places that list
the supported series).
"""
