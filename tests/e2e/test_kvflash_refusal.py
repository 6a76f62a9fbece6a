"""A request that cannot get host memory for its page-outs must make no other request preempt (issue 68, item 1):
with the host budget held by another process, a long request waits while the short requests beside it run through,
none of them preempted; once the budget frees, the long one completes.

So it is: a running request that cannot get host memory for its step is skipped for the step (vllm-luce's scheduler
asks the admission before vLLM allocates), and vLLM's check that a whole new sequence fits reserves no host memory.
Before, vLLM took the refusal for too few KV blocks: on vLLM 0.32 the long request headed the waiting queue (its
whole-sequence check asked for the whole prompt's host bytes) and the short requests behind it never started (0 of 8
in 500 steps); where the refusal came while it ran, vLLM preempted the requests after it one by one.

When the requests waiting for host memory wait for this engine's own requests, and none of those runs, the scheduler
preempts the one holding host memory that vLLM would preempt first, so that the others go on."""

import subprocess
import sys
import time

import pytest

from tests.e2e.dflash_probe import engine
from tests.e2e.test_kvflash import kvflash, make_llm, prompt
from tests.e2e.test_kvflash_tiers import chunk_bytes
from vllm_luce.kvflash.host_ledger import HostLedger

pytestmark = pytest.mark.e2e

POOL = 1024
HOLDER = """
import sys, time
from vllm_luce.kvflash.host_ledger import HostLedger
ledger = HostLedger(sys.argv[1], int(sys.argv[2]))  # budget, then the bytes to hold (default: all of it)
assert ledger.hold("pinned", int(sys.argv[3] if len(sys.argv) > 3 else sys.argv[2]))
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def hold_elsewhere(path: str, budget: int, nbytes: int | None = None) -> subprocess.Popen:
    """Another process (a server) holding ``nbytes`` (all of ``budget``) of the host ledger at ``path``, until its
    stdin closes."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, path, str(budget), str(nbytes or budget)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def record_preemptions(scheduler) -> list[str]:
    """The ids of the requests vLLM's scheduler preempts from now on, in order."""
    preempted, preempt = [], scheduler._preempt_request

    def recording(request, *args, **kwargs):
        preempted.append(request.request_id)
        return preempt(request, *args, **kwargs)

    scheduler._preempt_request = recording
    return preempted


@pytest.fixture(scope="module")
def qwen(tiny_model):
    return tiny_model("qwen3_6")


def test_a_refused_request_preempts_no_bystander_and_runs_once_memory_frees(qwen, tmp_path):
    from vllm import SamplingParams

    path, budget = str(tmp_path / "ledger"), 40 * chunk_bytes(qwen)
    holder = hold_elsewhere(path, budget)  # another server takes the whole budget
    try:  # another server took the whole budget
        llm = make_llm(qwen, kvflash(POOL, gpu_cold=False, host_bytes=budget, host_request_bytes=budget,
                                         host_ledger=path))
        preempted = record_preemptions(engine(llm).scheduler)
        params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
        llm.llm_engine.add_request("long", prompt(3000, 1), params)  # pages out beyond the pool: needs host memory
        for i in range(8):
            llm.llm_engine.add_request(f"short{i}", prompt(200, 10 + i), params)
        finished, steps = set(), 0
        while not {f"short{i}" for i in range(8)} <= finished:
            finished |= {out.request_id for out in llm.llm_engine.step() if out.finished}
            steps += 1
            assert steps < 500, (f"the short requests did not finish: {sorted(finished)}; {len(preempted)} "
                                 f"preemptions, of {len(set(preempted) - {'long'})} short requests")
        assert "long" not in finished and preempted == [], preempted  # nobody was preempted for the long one
        assert HostLedger(path, "auto").held("pageable") == 0
        holder.stdin.close()  # the other server goes: its share comes back to the host
        holder.wait(timeout=30)
        deadline = time.monotonic() + 300
        while "long" not in finished:
            finished |= {out.request_id for out in llm.llm_engine.step() if out.finished}
            assert time.monotonic() < deadline, "the long request never ran"
        assert preempted == []
        del llm
    finally:
        holder.kill()


def test_requests_waiting_on_each_others_host_memory_make_room_by_preempting_one_holder(qwen, tmp_path):
    """Two long requests whose page-outs together pass the budget (22 chunks each at their prompts' end, 40 in all,
    and a chunk more every 64 tokens they decode) and short ones: the later one takes what the earlier leaves, both
    then wait for more, the later is preempted (and computed again later) and the earlier runs on; every request
    completes and no short one is preempted."""
    from vllm import SamplingParams

    budget = 40 * chunk_bytes(qwen)
    llm = make_llm(qwen, kvflash(POOL, gpu_cold=False, host_bytes=budget, host_request_bytes=budget,
                                 host_ledger=str(tmp_path / "ledger")))
    preempted = record_preemptions(engine(llm).scheduler)
    long, short = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True), \
        SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    names = ["long0", "long1", *(f"short{i}" for i in range(4))]
    for i, name in enumerate(names):
        llm.llm_engine.add_request(name, prompt(2400 if i < 2 else 200, 20 + i), long if i < 2 else short)
    finished, deadline = set(), time.monotonic() + 120  # about 15 s on 2 cores
    while finished != set(names):
        finished |= {out.request_id for out in llm.llm_engine.step() if out.finished}
        assert time.monotonic() < deadline, f"finished {sorted(finished)}; preempted {preempted}"
    assert preempted and {p.split("-")[0] for p in preempted} <= {"long0", "long1"}, preempted  # engine ids: <id>-<hex>
    assert engine(llm).scheduler.luce_admission.total() == 0
    del llm


def test_a_request_that_cannot_get_host_memory_in_time_or_at_all_ends_with_an_error(qwen, tmp_path, monkeypatch):
    """The wait is bounded (luce.kvflash.host_wait_s): with the budget held by another server, a long request ends
    with an error once it has waited that long, and one asking for more than its share (a prompt the API server would
    refuse, sent to the engine directly) ends at once; the short requests beside them complete."""
    from vllm import SamplingParams

    # the engine's facts unknown to the client (a headless engine, or its facts file missing): nothing refuses the
    # huge prompt before the engine
    monkeypatch.setattr("vllm_luce.kvflash.engine_tiers.read_facts", lambda vllm_config: None)
    path, budget = str(tmp_path / "ledger"), 40 * chunk_bytes(qwen)
    holder = hold_elsewhere(path, budget)  # another server takes the whole budget
    try:
        llm = make_llm(qwen, kvflash(POOL, gpu_cold=False, host_bytes=budget, host_request_bytes=budget,
                                         host_ledger=path, host_wait_s=1.0))
        scheduler, why = engine(llm).scheduler, {}
        fail = scheduler._luce_fail
        scheduler._luce_fail = lambda expired: (why.update(expired), fail(expired))
        params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
        added = time.monotonic()
        llm.llm_engine.add_request("long", prompt(2400, 1), params)  # 22 chunks: within its share, not the budget
        llm.llm_engine.add_request("huge", prompt(3900, 2), params)  # beyond a share of 40 chunks
        for i in range(4):
            llm.llm_engine.add_request(f"short{i}", prompt(200, 10 + i), params)
        reasons, ended = {}, {}
        deadline = time.monotonic() + 120
        while len(reasons) < 6:
            for out in llm.llm_engine.step():
                if out.finished:
                    reasons[out.request_id] = out.outputs[0].finish_reason if out.outputs else None
                    ended[out.request_id] = time.monotonic()
            assert time.monotonic() < deadline, reasons
        assert reasons == {"long": "error", "huge": "error", **{f"short{i}": "length" for i in range(4)}}, reasons
        assert {r.split("-")[0]: w for r, w in why.items()} == {"long": "wait", "huge": "share"}, why
        assert ended["long"] - added >= 1.0  # it waited host_wait_s first
        admission = scheduler.luce_admission
        assert admission.expired == 2 and admission.total() == 0 and not admission.waiting_since
        del llm
    finally:
        holder.kill()
