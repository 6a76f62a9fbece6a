"""KVFlash's host budget, shared by every engine on the host through one small file (pure; no vLLM import).

Paged-out KV lives in host memory, and every server, data-parallel engine and rank on a host draws on the same RAM.
So the budget (``luce.kvflash.host_bytes``) is the host's, kept in one file (``luce.kvflash.host_ledger``, in
``/dev/shm`` by default) that holds it and one slot per process and kind of holding:

* ``pinned``: a worker's slabs pinned at startup for page-outs (``host_pool.py``);
* ``pageable``: an engine core's reservation for page-outs beyond its workers' pinned memory (``admission.py``).

Each slot carries its engine's tag (``engine_tag``: the engine's instance id and data-parallel rank, which its
engine core and workers compute alike), so an engine core finds its workers' pinned bytes.

Every change takes an exclusive ``flock`` of the file (and a thread lock), reads the slots, and writes its own only if
the sum stays within the budget: the budget holds exactly, whatever the number of engines. **A slot is live while its
process holds a lock on it**: the process that fills a slot takes an open-file-description lock (``F_OFD_SETLK``) on
the slot's bytes, and the kernel drops it when the process goes, however it goes. Others test the lock, never a pid,
so servers in other PID namespaces sharing the file (containers with ``--ipc=host``) see each other's slots, and a
slot nobody holds is reclaimed. A process finds its own slots by a random token (a pid may repeat across namespaces).
The first process to open a ledger with no live slot sets the budget ('auto': half the memory available then, and
within this container's cgroup memory limit); later ones use it, and an explicit ``host_bytes`` that differs stops
startup with a message naming the setting.

The file is opened without following a symbolic link and must be a regular file of this server's user, writable by
no one else, of a ledger's size and format: anything else stops startup with a message naming
``luce.kvflash.host_ledger`` (a file in ``/dev/shm`` is writable by every local user's processes otherwise).
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import hashlib
import mmap
import os
import secrets
import stat
import struct
import threading
import weakref

MAGIC = b"LUCEHL02"
EARLIER_MAGIC = b"LUCEHL01"  # slots live by pid and start time: reinitialized once no such process runs
HEADER = struct.Struct("<8sq")  # magic, budget in bytes
SLOT = struct.Struct("<qqQqq")  # owner token (0: free), owner pid (for people), engine tag, kind, bytes
SLOTS = 512
SIZE = HEADER.size + SLOTS * SLOT.size
KINDS = {"pinned": 1, "pageable": 2}
DEFAULT_PATH = "/dev/shm/vllm-luce-kvflash-host"
_FLOCK = struct.Struct("hh4xqqi4x")  # Linux's struct flock: type, whence, start, len, pid (0 for OFD locks)


class LedgerError(ValueError):
    pass


def engine_tag(*parts) -> int:
    """A 63-bit tag that the processes of one engine compute alike (its instance id and data-parallel rank)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


CONTAINER_MARKS = ("/.dockerenv", "/run/.containerenv")  # Docker's and Podman's


def in_container(marks: tuple[str, ...] = CONTAINER_MARKS, environ=os.environ) -> bool:
    """Whether this process runs in a container (Docker, Podman, Kubernetes, or one that sets ``container``)."""
    return any(os.path.exists(m) for m in marks) or bool(environ.get("container")) \
        or "KUBERNETES_SERVICE_HOST" in environ


def auto_budget(meminfo: str = "/proc/meminfo", cgroup: str | None = "/proc/self/cgroup",
                cgroup_root: str = "/sys/fs/cgroup", container: bool | None = None) -> int:
    """'auto': half the memory available now (``MemAvailable``), and never more than half of what this process's
    cgroup (a container's memory limit) has left. In a container with no memory limit (``sharing_unknown``) a quarter
    of the memory available: servers in other containers, each with its own /dev/shm, may count the same memory."""
    try:
        with open(meminfo) as f:
            available = 1024 * next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    left = cgroup_memory_left(cgroup, cgroup_root) if cgroup else None
    if left is None and (in_container() if container is None else container):
        return available // 4
    return (available if left is None else min(available, left)) // 2


def sharing_unknown(cgroup: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup") -> bool:
    """Whether the host's other servers may not see this ledger while using the same memory: a container (whose own
    /dev/shm, if it has one, hides the ledger from the other containers) with no memory limit to bound its budget."""
    return in_container() and cgroup_memory_left(cgroup, cgroup_root) is None


def cgroup_memory_left(cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes this process's memory cgroup (and every cgroup above it) may still use: limit less usage, the least of
    them (cgroup v2 ``memory.max``/``memory.current``, v1 ``memory.limit_in_bytes``/``memory.usage_in_bytes``);
    None where no limit is set or none can be read."""
    try:
        with open(cgroup) as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    left = []
    for _, controllers, path in (line for line in lines if len(line) == 3):
        if controllers == "":  # v2: limits at every level down to this process's cgroup
            names, base = ("memory.max", "memory.current"), root
        elif "memory" in controllers.split(","):
            names, base = ("memory.limit_in_bytes", "memory.usage_in_bytes"), os.path.join(root, "memory")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts) + 1):
            folder = os.path.join(base, *parts[:depth])
            try:
                with open(os.path.join(folder, names[0])) as f:
                    limit = f.read().strip()
                with open(os.path.join(folder, names[1])) as f:
                    usage = int(f.read().strip())
            except (OSError, ValueError):
                continue
            if limit.isdigit() and int(limit) < 2 ** 62:  # "max" (v2) or a page-rounded 2^63 (v1): no limit
                left.append(max(0, int(limit) - usage))
    return min(left) if left else None


_TOKEN: list[int] = [0, 0]  # [pid, token]: this process's token, drawn anew in a forked child


def _token() -> int:
    if _TOKEN[0] != os.getpid():
        _TOKEN[:] = [os.getpid(), secrets.randbits(62) + 1]
    return _TOKEN[1]


def _earlier_version_live(data: bytes) -> bool:
    """Whether a ledger of the earlier format has a slot whose process (by pid) may still run."""
    pids = (SLOT.unpack_from(data, HEADER.size + i * SLOT.size)[0] for i in range(SLOTS))
    return any(pid > 0 and os.path.exists(f"/proc/{pid}") for pid in pids)


def _open_checked(path: str, write: bool = True) -> int:
    """The ledger file's descriptor, created (mode 0600) if missing; refused with a message where it is a link, not a
    regular file, another user's, writable by others, or not a ledger's size."""
    def refuse(why: str) -> LedgerError:
        return LedgerError(f"luce.kvflash.host_ledger {path}: {why}; refusing to use it for the KVFlash host budget: "
                           "remove it if no vllm-luce server uses it, or give this server another host_ledger file")

    flags = (os.O_RDWR | os.O_CREAT if write else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise refuse("is a symbolic link") from None
        raise LedgerError(f"luce.kvflash.host_ledger {path}: cannot open it ({e.strerror})") from None
    info = os.fstat(fd)
    why = ("is not a regular file" if not stat.S_ISREG(info.st_mode) else
           f"belongs to uid {info.st_uid}, not to this server's ({os.geteuid()})" if info.st_uid != os.geteuid() else
           f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})" if info.st_mode & 0o022 else
           f"is {info.st_size} bytes, not a ledger's {SIZE}" if info.st_size not in (0, SIZE) else None)
    if why:
        os.close(fd)
        raise refuse(why)
    return fd


def _lock(fd: int, index: int, kind: int, test: bool = False) -> int:
    """Set (``F_OFD_SETLK``) or test (``test``: ``F_OFD_GETLK``, returns the type found) a lock on slot ``index``."""
    offset = HEADER.size + index * SLOT.size
    out = fcntl.fcntl(fd, fcntl.F_OFD_GETLK if test else fcntl.F_OFD_SETLK,
                      _FLOCK.pack(kind, os.SEEK_SET, offset, SLOT.size, 0))
    return _FLOCK.unpack(out)[0]


def _held_by_someone(fd: int, index: int) -> bool:
    """Whether another open file description (another process, or another ledger of this one) holds slot ``index``."""
    return _lock(fd, index, fcntl.F_RDLCK, test=True) != fcntl.F_UNLCK


def read_held(path: str) -> dict | None:
    """The budget and the live slots' pinned and pageable bytes, read without taking a slot or the file's lock (a
    monitor's view); None where there is no ledger of this format."""
    try:
        fd = _open_checked(path, write=False)
    except LedgerError:
        return None
    try:
        data = os.pread(fd, SIZE, 0)
        if len(data) < SIZE or HEADER.unpack_from(data, 0)[0] != MAGIC:
            return None
        held = {kind: 0 for kind in KINDS}
        names = {code: kind for kind, code in KINDS.items()}
        for i in range(SLOTS):
            token, _, _, code, nbytes = SLOT.unpack_from(data, HEADER.size + i * SLOT.size)
            if token and code in names and _held_by_someone(fd, i):
                held[names[code]] += nbytes
        return {"budget": HEADER.unpack_from(data, 0)[1], **held}
    finally:
        os.close(fd)


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
    def __init__(self, path: str, budget: int | str, meminfo: str = "/proc/meminfo", container: bool | None = None):
        self.path = path
        self._lock = threading.Lock()
        self._fd = _open_checked(path)  # the locks' open file description: the flock and the slots' locks
        try:
            if os.fstat(self._fd).st_size < SIZE:
                os.ftruncate(self._fd, SIZE)
            self._map = mmap.mmap(self._fd, SIZE)
        except OSError:
            os.close(self._fd)
            raise
        self._mine: set[int] = set()  # slots this ledger's description holds a lock on
        with self._locked():
            magic, held_budget = HEADER.unpack_from(self._map, 0)
            data = bytes(self._map[:SIZE])
            if magic == EARLIER_MAGIC and _earlier_version_live(data):
                raise LedgerError(f"luce.kvflash.host_ledger {path}: a server of an earlier vllm-luce version uses "
                                  "this ledger; give this server another host_ledger file, or stop that server")
            if magic not in (MAGIC, EARLIER_MAGIC) and any(data):
                raise LedgerError(f"luce.kvflash.host_ledger {path}: not a vllm-luce host ledger (it starts with "
                                  f"{data[:8]!r}); refusing to use it: remove it if nothing uses it, or give this "
                                  "server another host_ledger file")
            if magic == MAGIC:
                self._check_slots(held_budget)
            live = magic == MAGIC and any(self._reap_slot(i) for i in range(SLOTS))
            wanted = auto_budget(meminfo, container=container) if budget == "auto" else int(budget)
            if not live:
                self._map[:SIZE] = bytes(SIZE)
                HEADER.pack_into(self._map, 0, MAGIC, wanted)
            elif budget != "auto" and wanted != held_budget:
                self._conflict(wanted, held_budget)
        _LEDGERS.add(self)
        atexit.register(self.close)

    def _check_slots(self, budget: int) -> None:
        bad = [i for i, (token, _, _, code, nbytes) in self._slots()
               if token and (code not in KINDS.values() or not 0 <= nbytes <= budget)]
        if budget <= 0 or bad:
            raise LedgerError(f"luce.kvflash.host_ledger {self.path}: corrupt (budget {budget}, {len(bad)} slots out "
                              "of range); refusing to use it: remove it if no vllm-luce server uses it, or give this "
                              "server another host_ledger file")

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
            index = self._find(_token(), KINDS[kind], engine)
            return 0 if index is None else SLOT.unpack_from(self._map, self._offset(index))[4]

    # ------------------------------------------------------------------ changing

    def hold(self, kind: str, nbytes: int, engine: int = 0) -> bool:
        """Set this process's ``kind`` holding for ``engine`` to ``nbytes``; an increase that would take the host past
        the budget changes nothing and returns False. A decrease always succeeds."""
        return self.hold_up_to(kind, nbytes, engine, partial=False) == nbytes

    def hold_up_to(self, kind: str, nbytes: int, engine: int = 0, partial: bool = True, leave: int = 0) -> int:
        """Set this process's ``kind`` holding for ``engine`` to ``nbytes``, or (``partial``) to as much of it as the
        budget leaves; an increase leaves at least ``leave`` bytes of the budget unheld. Returns the holding now."""
        token, code = _token(), KINDS[kind]
        with self._locked():
            index = self._find(token, code, engine)
            current = 0 if index is None else SLOT.unpack_from(self._map, self._offset(index))[4]
            if nbytes > current:
                room = self.budget - self._sum() - leave
                if nbytes - current > room:
                    room += self._reap()
                if nbytes - current > room:
                    if not partial:
                        return current
                    nbytes = current + max(0, room)
            if index is None:
                if nbytes == 0:
                    return 0
                index = self._claim_free_slot()
            if nbytes:
                SLOT.pack_into(self._map, self._offset(index), token, os.getpid(), engine, code, nbytes)
            else:
                self._free(index)
            return nbytes

    def close(self) -> None:
        """Give back what this process holds (at exit; a crashed process's slots are reclaimed by the next one)."""
        if self._map.closed:
            return
        token = _token()
        with self._locked():
            for index, (t, _, _, _, _) in list(self._slots()):
                if t == token:
                    self._free(index)

    def _forget_after_fork(self) -> None:
        """In a forked child: close the parent's descriptions, so that the child living on keeps no slot of the
        parent's alive (the child opens its own ledger, ``open_ledger``)."""
        self._map.close()
        os.close(self._fd)
        self._mine.clear()

    # ------------------------------------------------------------------ internals

    def _locked(self):
        ledger = self

        class _Held:
            def __enter__(self):
                ledger._lock.acquire()
                fcntl.flock(ledger._fd, fcntl.LOCK_EX)

            def __exit__(self, *exc):
                fcntl.flock(ledger._fd, fcntl.LOCK_UN)
                ledger._lock.release()

        return _Held()

    @staticmethod
    def _offset(index: int) -> int:
        return HEADER.size + index * SLOT.size

    def _slots(self):
        for index in range(SLOTS):
            yield index, SLOT.unpack_from(self._map, self._offset(index))

    def _find(self, token: int, code: int, engine: int) -> int | None:
        return next((i for i, (t, _, e, k, _) in self._slots() if t == token and k == code and e == engine), None)

    def _claim_free_slot(self) -> int:
        """A free slot, locked by this ledger's description (a free slot another description of this process still
        locks is passed over)."""
        for attempt in range(2):
            for index, (token, *_rest) in self._slots():
                if token:
                    continue
                try:
                    _lock(self._fd, index, fcntl.F_WRLCK)
                except OSError:
                    continue
                self._mine.add(index)
                return index
            if not attempt:
                self._reap()
        raise LedgerError(f"luce.kvflash.host_ledger {self.path}: all {SLOTS} slots are in use")

    def _free(self, index: int) -> None:
        SLOT.pack_into(self._map, self._offset(index), 0, 0, 0, 0, 0)
        if index in self._mine:
            _lock(self._fd, index, fcntl.F_UNLCK)
            self._mine.discard(index)

    def _sum(self, kind: str | None = None, engine: int | None = None) -> int:
        code = KINDS[kind] if kind else None
        return sum(n for _, (t, _, e, k, n) in self._slots()
                   if t and (code is None or k == code) and (engine is None or e == engine))

    def _reap_slot(self, index: int) -> bool:
        """Whether slot ``index`` is live (this process's, or locked by another); a dead one is cleared."""
        token = SLOT.unpack_from(self._map, self._offset(index))[0]
        if not token:
            return False
        if token == _token() or _held_by_someone(self._fd, index):
            return True
        SLOT.pack_into(self._map, self._offset(index), 0, 0, 0, 0, 0)
        return False

    def _reap(self) -> int:
        """Clear the slots of processes that have gone; returns the bytes freed."""
        before = self._sum()
        for index in range(SLOTS):
            self._reap_slot(index)
        return before - self._sum()


_LEDGERS: "weakref.WeakSet[HostLedger]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for ledger in list(_LEDGERS):
        if not ledger._map.closed:
            ledger._forget_after_fork()
    _LEDGERS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
