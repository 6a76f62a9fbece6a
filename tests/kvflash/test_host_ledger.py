"""The host-wide ledger of KVFlash's host memory: exact under concurrent processes, shared budget (across PID
namespaces too), reclaiming the slots of processes that have gone, refusing unsafe or foreign files, clear errors."""

import multiprocessing
import os
import random
import shutil
import subprocess
import sys

import pytest

from vllm_luce.kvflash.host_ledger import (EARLIER_MAGIC, HEADER, KINDS, SIZE, SLOT, HostLedger, LedgerError,
                                          auto_budget, engine_tag, in_container)

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


def test_a_slot_nobody_locks_is_dead_whatever_its_pid_says(tmp_path):
    """Liveness is the slot's lock, never a pid: a slot written by hand that no process locks (token 1, the pid and
    start time 1 and 0 in a pid-based reading, which would keep it live for good) is reclaimed, and the budget set
    anew."""
    path = str(tmp_path / "ledger")
    ledger = HostLedger(path, 8 * MIB)
    ledger._map[HEADER.size:HEADER.size + SLOT.size] = SLOT.pack(1, 0, 0, KINDS["pageable"], 8 * MIB)
    ledger._map.flush()
    other = HostLedger(path, 16 * MIB)  # no live slot: this one sets the budget anew, without a conflict
    assert other.held() == 0 and other.budget == 16 * MIB


HOLD = """
import os, sys, time
from vllm_luce.kvflash.host_ledger import HostLedger
ledger = HostLedger(sys.argv[1], int(sys.argv[2]))
assert ledger.hold("pageable", int(sys.argv[3]))
if len(sys.argv) > 4 and os.fork() == 0:  # a child that outlives its parent, holding nothing of its own
    time.sleep(60)
    os._exit(0)
print(os.getpid(), flush=True)
sys.stdin.read() if len(sys.argv) <= 4 else os._exit(0)
"""


def _holder(path, budget, nbytes, *extra, unshare=False):
    command = [sys.executable, "-c", HOLD, path, str(budget), str(nbytes), *extra]
    if unshare:
        command = ["unshare", "--pid", "--fork", "--mount-proc", *command]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=os.getcwd(),
                            env=dict(os.environ, PYTHONPATH=os.getcwd()))


def _can_unshare() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="creating a PID namespace needs unshare and the right to use it")
def test_servers_in_other_pid_namespaces_share_the_budget(tmp_path):
    """A server in another PID namespace (a container sharing /dev/shm through --ipc=host): its pid means nothing here
    (it is 1 or 2 there), yet its slot is live, counted, and neither reaped nor reset by a newcomer."""
    path = str(tmp_path / "ledger")
    holder = _holder(path, 8 * MIB, 6 * MIB, unshare=True)
    try:
        assert int(holder.stdout.readline()) < 10  # its pid in its own namespace
        ledger = HostLedger(path, "auto")
        assert ledger.budget == 8 * MIB and ledger.held() == 6 * MIB
        assert not ledger.hold("pageable", 3 * MIB) and ledger.hold("pageable", 2 * MIB)
        with pytest.raises(LedgerError, match="luce.kvflash.host_bytes: got"):
            HostLedger(path, 4 * MIB)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert ledger.held() == 2 * MIB and ledger.hold("pageable", 8 * MIB)  # its slot went with it


def test_a_forked_child_does_not_keep_its_parent_s_slot_alive(tmp_path):
    path = str(tmp_path / "ledger")
    holder = _holder(path, 8 * MIB, 8 * MIB, "fork")  # holds, forks a child that sleeps, exits at once
    holder.wait(timeout=30)
    assert holder.returncode == 0
    ledger = HostLedger(path, 8 * MIB)
    assert ledger.hold("pageable", 8 * MIB)  # the parent's slot was reclaimed while its child still runs


@pytest.mark.parametrize("case", ["symlink", "world_writable", "wrong_size", "foreign", "corrupt", "directory"])
def test_an_unsafe_or_foreign_ledger_file_is_refused_with_a_message(tmp_path, case):
    path = tmp_path / "ledger"
    if case == "symlink":
        HostLedger(str(tmp_path / "real"), MIB).close()
        path.symlink_to(tmp_path / "real")
    elif case == "world_writable":
        HostLedger(str(path), MIB).close()
        path.chmod(0o666)
    elif case == "wrong_size":
        path.write_bytes(b"x" * 100)
    elif case == "foreign":
        path.write_bytes(os.urandom(SIZE))
        path.chmod(0o600)
    elif case == "corrupt":
        ledger = HostLedger(str(path), MIB)
        assert ledger.hold("pageable", MIB // 2)  # live, with a slot whose kind is out of range
        ledger._map[HEADER.size + 24:HEADER.size + 32] = (99).to_bytes(8, "little")
    elif case == "directory":
        path.mkdir()
    why = {"symlink": "symbolic link", "world_writable": "writable by group or others", "wrong_size": "not a ledger",
           "foreign": "not a vllm-luce host ledger", "corrupt": "corrupt", "directory": "cannot open it"}[case]
    with pytest.raises(LedgerError, match=rf"luce.kvflash.host_ledger {path}: .*{why}"):
        HostLedger(str(path), MIB)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_user_s_ledger_is_refused(tmp_path):
    path = tmp_path / "ledger"
    HostLedger(str(path), MIB).close()
    os.chown(path, 4321, 4321)
    with pytest.raises(LedgerError, match="belongs to uid 4321"):
        HostLedger(str(path), MIB)


def test_a_ledger_of_the_earlier_format_is_taken_over_once_its_servers_are_gone(tmp_path):
    path = tmp_path / "ledger"
    data = bytearray(SIZE)
    HEADER.pack_into(data, 0, EARLIER_MAGIC, MIB)
    SLOT.pack_into(data, HEADER.size, os.getpid(), 0, 0, 1, MIB)  # a live pid: an earlier server may still run
    path.write_bytes(bytes(data))
    path.chmod(0o600)
    with pytest.raises(LedgerError, match="earlier vllm-luce version"):
        HostLedger(str(path), MIB)
    SLOT.pack_into(data, HEADER.size, 2 ** 31 - 5, 0, 0, 1, MIB)  # no such process
    path.write_bytes(bytes(data))
    assert HostLedger(str(path), 2 * MIB).budget == 2 * MIB


def test_auto_stays_within_the_container_s_memory_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n")  # 32 GiB available on the host
    (tmp_path / "v2" / "pod" / "ctr").mkdir(parents=True)
    (tmp_path / "v2" / "pod" / "memory.max").write_text(f"{16 << 30}\n")
    (tmp_path / "v2" / "pod" / "memory.current").write_text(f"{10 << 30}\n")
    (tmp_path / "v2" / "pod" / "ctr" / "memory.max").write_text("max\n")
    (tmp_path / "v2" / "pod" / "ctr" / "memory.current").write_text(f"{9 << 30}\n")
    (tmp_path / "v2.cgroup").write_text("0::/pod/ctr\n")
    assert auto_budget(str(meminfo), str(tmp_path / "v2.cgroup"), str(tmp_path / "v2")) == (6 << 30) // 2
    (tmp_path / "v1" / "memory" / "docker").mkdir(parents=True)
    (tmp_path / "v1" / "memory" / "docker" / "memory.limit_in_bytes").write_text(f"{8 << 30}\n")
    (tmp_path / "v1" / "memory" / "docker" / "memory.usage_in_bytes").write_text(f"{2 << 30}\n")
    (tmp_path / "v1.cgroup").write_text("5:cpu,cpuacct:/docker\n4:memory:/docker\n")
    assert auto_budget(str(meminfo), str(tmp_path / "v1.cgroup"), str(tmp_path / "v1")) == (6 << 30) // 2
    (tmp_path / "v1" / "memory" / "docker" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # none
    no_limit = (str(meminfo), str(tmp_path / "v1.cgroup"), str(tmp_path / "v1"))
    assert auto_budget(*no_limit, container=False) == (32 << 30) // 2
    assert auto_budget(str(meminfo), str(tmp_path / "missing"), str(tmp_path), container=False) == (32 << 30) // 2
    # a container with no memory limit: whether other containers count the same memory is unknown, a quarter
    assert auto_budget(*no_limit, container=True) == (32 << 30) // 4


def test_a_container_is_known_by_its_marks_or_environment(tmp_path):
    mark = tmp_path / ".dockerenv"
    assert not in_container((str(mark),), {})
    assert in_container((str(mark),), {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert in_container((str(mark),), {"container": "podman"}) and not in_container((str(mark),), {"container": ""})
    mark.write_text("")
    assert in_container((str(mark),), {})
