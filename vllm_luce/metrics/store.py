"""Process-local metric values and their hand-off to the process that serves ``/metrics`` (no vLLM import).

vLLM's ``/metrics`` is served by the API server, but DFlash's gate lives in the engine core's
scheduler and KVFlash's pagers in the workers. Each process keeps its values in one ``MetricStore``;
a daemon thread writes a JSON snapshot of it (only when it changed, at most once a second) to
``$LUCE_METRICS_DIR/<pid>.json``, replaced atomically. The API server's collector
(``collector.py``) merges its own store with the snapshots of the other live processes of the same
server, the way Prometheus' own multiprocess mode merges its mmap files, without switching vLLM's
metrics into that mode. With ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` there is one process and no file.

Counters are cumulative totals set by their owner (``set_total``) or incremented (``inc``);
gauges are last values. A sample is (name, labels) -> value; labels are a sorted tuple of pairs.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import threading
import time
from typing import Iterable

DIR_ENV = "LUCE_METRICS_DIR"  # not VLLM_*: vLLM warns about VLLM_ variables it does not know
OWNER_ENV = "LUCE_METRICS_OWNER"
PUBLISH_EVERY_S = 1.0

Labels = tuple[tuple[str, str], ...]
Key = tuple[str, Labels]


def labels_of(labels: dict[str, object]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


class MetricStore:
    def __init__(self):
        self.lock = threading.Lock()
        self.values: dict[str, dict[Key, float]] = {"counter": {}, "gauge": {}}
        self.version = 0

    def inc(self, name: str, value: float = 1.0, **labels) -> None:
        key = (name, labels_of(labels))
        with self.lock:
            counters = self.values["counter"]
            counters[key] = counters.get(key, 0.0) + float(value)
            self.version += 1

    def set_total(self, name: str, value: float, **labels) -> None:
        self._set("counter", name, value, labels)

    def set_gauge(self, name: str, value: float, **labels) -> None:
        self._set("gauge", name, value, labels)

    def remove_gauges(self, name: str) -> None:
        """Drop every series of a gauge (e.g. per-regime rates that are recomputed as a whole)."""
        with self.lock:
            gauges = self.values["gauge"]
            for key in [k for k in gauges if k[0] == name]:
                del gauges[key]
            self.version += 1

    def _set(self, kind: str, name: str, value: float, labels: dict) -> None:
        with self.lock:
            self.values[kind][(name, labels_of(labels))] = float(value)
            self.version += 1

    def snapshot(self) -> dict[str, list]:
        with self.lock:
            return {kind: [[name, [list(p) for p in labels], value] for (name, labels), value in series.items()]
                    for kind, series in self.values.items()}

    def clear(self) -> None:
        with self.lock:
            for series in self.values.values():
                series.clear()
            self.version += 1


def merge(snapshots: Iterable[dict[str, list]]) -> dict[str, dict[Key, float]]:
    """Sum counters and gauges of equal name and labels across processes (producers label what differs)."""
    out: dict[str, dict[Key, float]] = {"counter": {}, "gauge": {}}
    for snap in snapshots:
        for kind in out:
            for name, labels, value in snap.get(kind, []):
                key = (name, tuple(tuple(p) for p in labels))
                out[kind][key] = out[kind].get(key, 0.0) + float(value)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_snapshots(directory: str | None, skip_pid: int) -> list[dict[str, list]]:
    """Snapshots of the other live processes (files of dead processes are removed)."""
    if not directory or not os.path.isdir(directory):
        return []
    found = []
    for entry in os.listdir(directory):
        stem, ext = os.path.splitext(entry)
        if ext != ".json" or not stem.isdigit() or int(stem) == skip_pid:
            continue
        path = os.path.join(directory, entry)
        if not _alive(int(stem)):
            try:
                os.unlink(path)
            except OSError:
                pass
            continue
        try:
            with open(path) as f:
                found.append(json.load(f))
        except (OSError, ValueError):  # replaced between listdir and open: next scrape reads it
            continue
    return found


class Publisher:
    """Writes the store's snapshot for this process when it changed (a daemon thread, fork-aware)."""

    def __init__(self, store: MetricStore):
        self.store = store
        self.pid: int | None = None
        self.publishing = False
        self.written_version = -1
        self.lock = threading.Lock()  # the thread and ``flush`` never interleave: the newer snapshot lands last

    def ensure_started(self) -> None:
        pid = os.getpid()
        if self.pid == pid:
            return  # decided for this process: publishing, or nowhere to publish
        if self.pid is not None:  # forked: the values belong to the parent, the lock may be held by its thread
            self.store.clear()
            self.lock = threading.Lock()
        self.pid, self.written_version, self.publishing = pid, -1, False
        if not os.environ.get(DIR_ENV) or os.environ.get(OWNER_ENV) == str(pid):
            return  # nowhere to publish, or this process serves /metrics itself
        self.publishing = True
        threading.Thread(target=self._loop, name="vllm-luce-metrics", daemon=True).start()
        atexit.register(self._remove_own_file)

    def path(self) -> str:
        return os.path.join(os.environ[DIR_ENV], f"{os.getpid()}.json")

    def publish(self) -> None:
        with self.lock:
            version = self.store.version
            if version == self.written_version:
                return
            directory = os.environ[DIR_ENV]
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(self.store.snapshot(), f)
            os.replace(tmp, self.path())
            self.written_version = version

    def flush(self) -> None:
        """Write now rather than at the next tick, where this process publishes: a reader that asked this process
        for its values (an RPC) and then scrapes ``/metrics`` reads the same values, not those of a second ago."""
        if self.publishing and self.pid == os.getpid():
            self.publish()

    def _loop(self) -> None:
        me = os.getpid()
        while os.getpid() == me:
            try:
                self.publish()
            except OSError:
                pass  # metrics must never take a process down; retried next tick
            time.sleep(PUBLISH_EVERY_S)

    def _remove_own_file(self) -> None:
        try:
            os.unlink(self.path())
        except (OSError, KeyError):
            pass


def claim_directory() -> None:
    """In the first process of a server (no directory named yet): name one for this server's processes
    (inherited by the engine core and workers) and remove it when this process exits."""
    if os.environ.get(DIR_ENV):
        return
    directory = os.path.join(tempfile.gettempdir(), f"vllm-luce-metrics-{os.getpid()}-{time.time_ns()}")
    os.environ[DIR_ENV] = directory
    os.environ[OWNER_ENV] = str(os.getpid())
    atexit.register(shutil.rmtree, directory, True)
