"""KVFlash's host budget, shared by every engine on the host through one small file (pure; no vLLM import).

Paged-out KV lives in host memory, and every server, data-parallel engine and rank on a host draws on the same RAM.
So the budget (``luce.kvflash.host_bytes``) is the host's, kept in one file (``luce.kvflash.host_ledger``, in
``/dev/shm`` by default) that holds it and one slot per process and kind of holding:

* ``pinned``: a worker's slabs pinned at startup for page-outs (``host_pool.py``);
* ``pageable``: an engine core's reservation for page-outs beyond its workers' pinned memory (``admission.py``).

Each slot carries its engine's tag (``engine_tag``: the engine's instance id and data-parallel rank, which its
engine core and workers compute alike), so an engine core finds its workers' pinned bytes.

Every change takes an exclusive ``flock`` of the file (and a thread lock), reads the slots, and writes its own only if
the sum stays within the budget: the budget holds exactly, whatever the number of engines. A slot whose process has
gone (no such pid, or a pid reused by a process that started later) is reclaimed. The first process to open a ledger
with no live slot sets the budget ('auto': half the memory available then); later ones use it, and an explicit
``host_bytes`` that differs stops startup with a message naming the setting.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import mmap
import os
import struct
import threading

MAGIC = b"LUCEHL01"
HEADER = struct.Struct("<8sq")  # magic, budget in bytes
SLOT = struct.Struct("<qqQqq")  # pid, process start time (clock ticks), engine tag, kind, bytes
SLOTS = 512
SIZE = HEADER.size + SLOTS * SLOT.size
KINDS = {"pinned": 1, "pageable": 2}
DEFAULT_PATH = "/dev/shm/vllm-luce-kvflash-host"


class LedgerError(ValueError):
    pass


def engine_tag(*parts) -> int:
    """A 63-bit tag that the processes of one engine compute alike (its instance id and data-parallel rank)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


def auto_budget(meminfo: str = "/proc/meminfo") -> int:
    """'auto': half the memory available now (``MemAvailable``)."""
    try:
        with open(meminfo) as f:
            available_kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        available_kib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024
    return available_kib * 1024 // 2


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (``/proc/<pid>/stat`` field 22); None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, IndexError):  # no procfs: is there such a pid at all?
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0


_OPEN: dict[tuple[str, int], "HostLedger"] = {}


def open_ledger(path: str, budget: int | str) -> "HostLedger":
    """This process's ledger at ``path`` (one per process, shared by the engines and workers it runs); a later
    explicit budget must agree with the one in force."""
    ledger = _OPEN.get((path, os.getpid()))
    if ledger is None or ledger._map.closed:
        ledger = _OPEN[(path, os.getpid())] = HostLedger(path, budget)
    elif budget != "auto" and int(budget) != ledger.budget:
        ledger._conflict(int(budget), ledger.budget)
    return ledger


class HostLedger:
    def __init__(self, path: str, budget: int | str, meminfo: str = "/proc/meminfo"):
        self.path = path
        self._lock = threading.Lock()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            os.ftruncate(fd, SIZE) if os.fstat(fd).st_size < SIZE else None
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._file = open(path, "rb")  # the flock's handle
        with self._locked():
            magic, held_budget = HEADER.unpack_from(self._map, 0)
            live = magic == MAGIC and any(self._reap_slot(i) for i in range(SLOTS))
            wanted = auto_budget(meminfo) if budget == "auto" else int(budget)
            if not live:
                self._map[:SIZE] = bytes(SIZE)
                HEADER.pack_into(self._map, 0, MAGIC, wanted)
            elif budget != "auto" and wanted != held_budget:
                self._conflict(wanted, held_budget)
        atexit.register(self.close)

    def _conflict(self, wanted: int, held_budget: int):
        raise LedgerError(
            f"luce.kvflash.host_bytes: got {wanted}; the servers already running on this host share a KVFlash host "
            f"budget of {held_budget} bytes (ledger {self.path}): set the same value or 'auto', or give this server "
            "its own budget with another luce.kvflash.host_ledger")

    # ------------------------------------------------------------------ reading

    @property
    def budget(self) -> int:
        return HEADER.unpack_from(self._map, 0)[1]

    def held(self, kind: str | None = None, engine: int | None = None) -> int:
        """Bytes held by live slots (of ``kind``, of ``engine``)."""
        with self._locked():
            return self._sum(kind, engine)

    def mine(self, kind: str, engine: int = 0) -> int:
        """What this process holds as ``kind`` for ``engine``."""
        with self._locked():
            index = self._find(os.getpid(), KINDS[kind], engine)
            return 0 if index is None else SLOT.unpack_from(self._map, self._offset(index))[4]

    # ------------------------------------------------------------------ changing

    def hold(self, kind: str, nbytes: int, engine: int = 0) -> bool:
        """Set this process's ``kind`` holding for ``engine`` to ``nbytes``; an increase that would take the host past
        the budget changes nothing and returns False. A decrease always succeeds."""
        return self.hold_up_to(kind, nbytes, engine, partial=False) == nbytes

    def hold_up_to(self, kind: str, nbytes: int, engine: int = 0, partial: bool = True) -> int:
        """Set this process's ``kind`` holding for ``engine`` to ``nbytes``, or (``partial``) to as much of it as the
        budget leaves; returns the holding now."""
        pid, code = os.getpid(), KINDS[kind]
        with self._locked():
            index = self._find(pid, code, engine)
            current = 0 if index is None else SLOT.unpack_from(self._map, self._offset(index))[4]
            if nbytes > current:
                room = self.budget - self._sum()
                if nbytes - current > room:
                    room += self._reap()
                if nbytes - current > room:
                    if not partial:
                        return current
                    nbytes = current + max(0, room)
            if index is None:
                if nbytes == 0:
                    return 0
                index = self._find(0, 0, 0)
                if index is None:
                    self._reap()
                    index = self._find(0, 0, 0)
                if index is None:
                    raise LedgerError(f"luce.kvflash.host_ledger {self.path}: all {SLOTS} slots are in use")
            if nbytes:
                SLOT.pack_into(self._map, self._offset(index), pid, _start_time(pid) or 0, engine, code, nbytes)
            else:
                SLOT.pack_into(self._map, self._offset(index), 0, 0, 0, 0, 0)
            return nbytes

    def close(self) -> None:
        """Give back what this process holds (at exit; a crashed process's slots are reclaimed by the next one)."""
        if self._map.closed:
            return
        pid = os.getpid()
        with self._locked():
            for index, (p, _, _, _, _) in list(self._slots()):
                if p == pid:
                    SLOT.pack_into(self._map, self._offset(index), 0, 0, 0, 0, 0)

    # ------------------------------------------------------------------ internals

    def _locked(self):
        ledger = self

        class _Held:
            def __enter__(self):
                ledger._lock.acquire()
                fcntl.flock(ledger._file, fcntl.LOCK_EX)

            def __exit__(self, *exc):
                fcntl.flock(ledger._file, fcntl.LOCK_UN)
                ledger._lock.release()

        return _Held()

    @staticmethod
    def _offset(index: int) -> int:
        return HEADER.size + index * SLOT.size

    def _slots(self):
        for index in range(SLOTS):
            yield index, SLOT.unpack_from(self._map, self._offset(index))

    def _find(self, pid: int, code: int, engine: int) -> int | None:
        return next((i for i, (p, _, e, k, _) in self._slots() if p == pid and k == code and e == engine), None)

    def _sum(self, kind: str | None = None, engine: int | None = None) -> int:
        code = KINDS[kind] if kind else None
        return sum(n for _, (p, _, e, k, n) in self._slots()
                   if p and (code is None or k == code) and (engine is None or e == engine))

    def _reap_slot(self, index: int) -> bool:
        """Whether slot ``index`` is live; a dead one is cleared."""
        pid, start, _, _, _ = SLOT.unpack_from(self._map, self._offset(index))
        if not pid:
            return False
        now = _start_time(pid)
        if now is not None and (not start or not now or now == start):
            return True
        SLOT.pack_into(self._map, self._offset(index), 0, 0, 0, 0, 0)
        return False

    def _reap(self) -> int:
        """Clear the slots of processes that have gone; returns the bytes freed."""
        before = self._sum()
        for index in range(SLOTS):
            self._reap_slot(index)
        return before - self._sum()
