"""One vLLM engine on the GPU, run as a subprocess by the GPU tier: `python -m tests.gpu.engine SPEC OUT`.

SPEC (JSON): {"model": path, "llm": {LLM keyword arguments}, "prompts": [text or token-id lists],
"max_tokens": n (or one per prompt), "xargs": [each prompt's vllm_xargs or null], "predictable": bool (register the
test-only drafter class; in-process engines only), "rpc": ["kvflash"] (the workers' KVFlash totals; "reselections":
each worker's reselections of every request: (tokens, resident before, resident after, {chunk: score}), any engine),
"kvflash_probe": bool, "mixed_steps": bool (count the steps that verify drafts beside a one-token row without drafts;
in-process engines only), "record_reselections": bool (each request's KVFlash reselections, in-process engines
only),
"logprobs": k (each position's sampled and top-k logprobs, and the top token ids), "gate": {GateConfig fields} (the
DFlash gate replaced by one of this config, e.g. one that switches every few steps; in-process engine cores only),
"aborts": [[prompt index, engine step], ...] (the prompts run through LLMEngine's step loop, each listed one aborted
after that many steps if still running; its tokens, texts and logprobs are null; any list, empty too, takes the step
loop)}. OUT gets the greedy token ids, the serving class, how vLLM ran (model runner, CUDA graphs, async
scheduling), vLLM's spec-decode counters and the vllm:luce_* metrics. Nothing here sets vLLM's runtime defaults: the
spec's `llm` and the caller's environment (VLLM_PLUGINS, VLLM_USE_V2_MODEL_RUNNER) decide."""

from __future__ import annotations

import json
import sys
import time

from fixtures.engine_report import config_facts, llm_counters


def _facts(llm) -> dict:
    return config_facts(llm.llm_engine.vllm_config,
                        ("v2_runner", "cudagraph_mode", "enforce_eager", "async_scheduling", "tensor_parallel_size"))


def _counters(llm) -> dict:
    """Spec-decode, preemption and vllm:luce_* counters and gauges, by name and labels (engine and model labels
    dropped)."""
    return llm_counters(llm, ("vllm:spec_decode_num", "vllm:num_preemptions", "vllm:luce_"))


def _count_mixed_steps(llm) -> list[int]:
    """A counter of the scheduler's steps that verify drafts beside a one-token row without drafts: where vLLM
    0.26's Gated DeltaNet layer gave verifying rows other rows' gates (``vllm026/spec_rows_first_v1.py``)."""
    scheduler, count = llm.llm_engine.engine_core.engine_core.scheduler, [0]
    schedule = scheduler.schedule

    def counted(*args, **kwargs):
        out = schedule(*args, **kwargs)
        drafts = out.scheduled_spec_decode_tokens or {}
        count[0] += bool(drafts) and any(n == 1 and r not in drafts for r, n in out.num_scheduled_tokens.items())
        return out

    scheduler.schedule = counted
    return count


def run(spec: dict) -> dict:
    from vllm import LLM, SamplingParams

    if spec.get("predictable"):
        from fixtures.predictable import register_predictable_drafter

        register_predictable_drafter()
    llm = LLM(model=spec["model"], disable_log_stats=False, **spec.get("llm", {}))
    if spec.get("gate"):
        from vllm_luce.spec_decode.gate import GateConfig, SpecGate

        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        scheduler.luce_gate = SpecGate(GateConfig(**spec["gate"]))
    mixed = _count_mixed_steps(llm) if spec.get("mixed_steps") else None
    probe = None
    if spec.get("kvflash_probe"):
        from tests.gpu import kvflash_probe

        probe = kvflash_probe.install(llm)
    prompts = [{"prompt_token_ids": p} if isinstance(p, list) else p for p in spec["prompts"]]
    xargs = spec.get("xargs") or [None] * len(prompts)  # each prompt's vllm_xargs
    lengths = spec.get("max_tokens", 24)
    lengths = lengths if isinstance(lengths, list) else [lengths] * len(prompts)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, extra_args=x,
                             logprobs=spec.get("logprobs")) for x, n in zip(xargs, lengths)]
    if "reselections" in spec.get("rpc", ()):
        llm.collective_rpc(_start_recording)
    start = time.perf_counter()
    aborted = None
    with _recording(spec.get("record_reselections")) as events:
        if spec.get("aborts") is None:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        else:
            outputs, aborted = _generate_aborting(llm.llm_engine, prompts, params, spec["aborts"])
    seconds = time.perf_counter() - start

    def each(f):  # per prompt; null for a request aborted
        return [None if o is None else f(o) for o in outputs]

    result = {"tokens": each(lambda o: list(o.outputs[0].token_ids)), "texts": each(lambda o: o.outputs[0].text),
              "prompt_tokens": [len(p["prompt_token_ids"]) if isinstance(p, dict) else None for p in prompts]
              if aborted is not None else [len(o.prompt_token_ids) for o in outputs],
              "class": llm.apply_model(class_name)[0],
              "seconds": seconds, **_facts(llm), "counters": _counters(llm)}
    if aborted is not None:
        result["aborted"] = aborted
    if spec.get("logprobs"):  # per position: the sampled token's logprob, then the top ones, best first
        result["logprobs"] = each(lambda o: [[step[t].logprob] + sorted((lp.logprob for lp in step.values()),
                                                                         reverse=True)
                                             for t, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)])
        result["top_ids"] = each(lambda o: [sorted(step, key=lambda i, s=step: -s[i].logprob)
                                            for step in o.outputs[0].logprobs])  # per position: best first
    if "kvflash" in spec.get("rpc", ()):
        result["kvflash"] = llm.collective_rpc(_kvflash_report)
    if "reselections" in spec.get("rpc", ()):
        from fixtures.reask import events_of

        by_rank = llm.collective_rpc(_recorded)
        result["rank_reselections"] = [[events_of(events, o.request_id) for o in outputs] for events in by_rank]
    if probe is not None:
        result["kvflash_probe"] = probe
    if mixed is not None:
        result["mixed_steps"] = mixed[0]
    if events is not None:
        from fixtures.reask import events_of

        result["reselections"] = [[(t, sorted(b), sorted(a)) for t, b, a in events_of(events, o.request_id)]
                                  if events else [] for o in outputs]
    return result


def _generate_aborting(engine, prompts, params, aborts) -> tuple[list, list[list[int]]]:
    """Every prompt added to ``engine`` (an LLMEngine) at once, then its step loop; each prompt of ``aborts`` (index,
    step) aborted after that many steps if it has not finished. The finished outputs in prompt order (None for one
    aborted) and, per abort made, [index, step, tokens it had]."""
    when = {str(index): step for index, step in aborts}
    for index, (prompt, param) in enumerate(zip(prompts, params)):
        engine.add_request(str(index), prompt, param)
    finished, latest, made, step = {}, {}, [], 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            (finished if out.finished else latest)[out.request_id] = out
        step += 1
        due = [r for r, s in when.items() if s <= step and r not in finished]
        for req in due:
            engine.abort_request([req])
            made.append([int(req), step, len(latest[req].outputs[0].token_ids) if req in latest else 0])
            del when[req]
    gone = {str(index) for index, _, _ in made}
    return [None if str(i) in gone else finished[str(i)] for i in range(len(prompts))], made


def _recording(on):
    """``fixtures.reask.record_reselections`` when asked for, else a context giving None."""
    import contextlib

    if not on:
        return contextlib.nullcontext()
    from fixtures.reask import record_reselections

    return record_reselections()


# What workers run is named by module (tests.gpu.engine, never __main__) so that it pickles to every rank.
def class_name(model) -> str:
    return type(model).__qualname__


_RECORDING: dict = {}


def _start_recording(worker) -> None:
    """In each worker: ``fixtures.reask.record_reselections`` with the scores, until ``_recorded``."""
    from fixtures.reask import record_reselections

    _RECORDING["context"] = record_reselections(scores=True)
    _RECORDING["events"] = _RECORDING["context"].__enter__()


def _recorded(worker) -> dict:
    _RECORDING.pop("context").__exit__(None, None, None)
    return {req: [(t, sorted(b), sorted(a), {str(c): s for c, s in scored.items()}) for t, b, a, scored in found]
            for req, found in _RECORDING.pop("events").items()}


def _kvflash_report(worker) -> dict:
    runtime = getattr(worker.model_runner, "luce_kvflash", None)
    if runtime is None:
        return {"bound": False}
    return {"bound": True, "host_bytes": runtime.host_bytes(), **runtime.stats()}


def main(spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        outcome = run(json.load(f))
    with open(out_path, "w") as f:
        json.dump(outcome, f)


if __name__ == "__main__":
    from tests.gpu.engine import main as imported_main  # functions sent to workers resolve as tests.gpu.engine.*

    imported_main(*sys.argv[1:])
