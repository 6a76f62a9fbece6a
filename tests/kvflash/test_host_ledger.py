"""The host-wide ledger of KVFlash's host memory: exact under concurrent processes, shared budget, reclaiming the
slots of processes that have gone, clear errors."""

import multiprocessing
import os
import random
import subprocess
import sys

import pytest

from vllm_luce.kvflash.host_ledger import SLOT, HostLedger, LedgerError, engine_tag

MIB = 1 << 20


def test_holds_up_to_the_budget_and_down_again(tmp_path):
    ledger = HostLedger(str(tmp_path / "ledger"), 10 * MIB)
    assert ledger.hold("pinned", 4 * MIB) and ledger.hold("pageable", 6 * MIB)
    assert not ledger.hold("pageable", 6 * MIB + 1) and ledger.mine("pageable") == 6 * MIB  # unchanged
    assert ledger.hold_up_to("pinned", 9 * MIB) == 4 * MIB  # nothing left
    assert ledger.hold("pageable", 1 * MIB) and ledger.held() == 5 * MIB
    assert ledger.hold_up_to("pinned", 20 * MIB) == 9 * MIB  # as much as is left
    ledger.close()
    assert ledger.held() == 0


def test_a_second_server_shares_the_first_ones_budget(tmp_path):
    path = str(tmp_path / "ledger")
    first = HostLedger(path, 10 * MIB)
    assert first.hold("pageable", 7 * MIB, engine=engine_tag("a", 0))
    second = HostLedger(path, "auto")  # 'auto' joins the budget in force
    assert second.budget == 10 * MIB
    with pytest.raises(LedgerError, match=r"luce.kvflash.host_bytes: got 5.*budget of 10485760 bytes.*host_ledger"):
        HostLedger(path, 5 * MIB)
    assert first.held(engine=engine_tag("a", 0)) == 7 * MIB and first.held(engine=engine_tag("b", 0)) == 0
    assert second.hold("pageable", 3 * MIB, engine=engine_tag("b", 0)) and not second.hold("pinned", 1)
    assert first.mine("pageable", engine_tag("b", 0)) == 3 * MIB  # one process: both engines' slots are its own


def _worker(path, budget, seed, steps, errors):
    ledger = HostLedger(path, budget)
    rng = random.Random(seed)
    for _ in range(steps):
        kind = rng.choice(["pinned", "pageable"])
        ledger.hold(kind, rng.randrange(0, budget // 2))
        total = ledger.held()
        if total > budget:
            errors.put(total)
    ledger.close()


def test_concurrent_processes_never_hold_more_than_the_budget(tmp_path):
    path, budget = str(tmp_path / "ledger"), 64 * MIB
    HostLedger(path, budget).close()
    errors = multiprocessing.get_context("spawn").Queue()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(path, budget, seed, 300, errors)) for seed in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs)
    assert errors.empty()
    assert HostLedger(path, budget).held() == 0  # every process gave back what it held


def test_a_crashed_process_s_holding_is_reclaimed(tmp_path):
    path = str(tmp_path / "ledger")
    code = (f"import os; from vllm_luce.kvflash.host_ledger import HostLedger; "
            f"l = HostLedger({path!r}, {8 * MIB}); assert l.hold('pageable', {8 * MIB}); os._exit(0)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.getcwd())
    ledger = HostLedger(path, 8 * MIB)  # the dead process's slot stays until someone needs the room
    assert ledger.hold("pageable", 8 * MIB) and ledger.held() == 8 * MIB


def test_a_reused_pid_does_not_keep_a_dead_slot_alive(tmp_path):
    path = str(tmp_path / "ledger")
    ledger = HostLedger(path, 8 * MIB)
    assert ledger.hold("pageable", 8 * MIB)
    # the same pid with another start time: a later process that reused it
    offset = 16  # the first slot, after the header
    pid, start, engine, kind, nbytes = SLOT.unpack_from(ledger._map, offset)
    SLOT.pack_into(ledger._map, offset, pid, start + 1, engine, kind, nbytes)
    other = HostLedger(path, 16 * MIB)  # no live slot left: this one sets the budget anew, without a conflict
    assert other.held() == 0 and other.budget == 16 * MIB
