"""Host memory pinned at startup for page-outs: within the host's ledger, exactly what was pinned held there, and a
failure to pin reported as one (naming the setting), never as a failed warm-up."""

import logging

import pytest
import torch

from vllm_luce.kvflash.host_ledger import HostLedger
from vllm_luce.kvflash.host_pool import PinnedChunkPool
from vllm_luce.kvflash.kv_store import PACKED_LAYOUT
from vllm_luce.kvflash.pager import PagerConfig
from vllm_luce.kvflash.runtime import KVFlashRuntime

SHAPE, DTYPE = (2, 64, 1, 128), torch.bfloat16  # one chunk: 32 KiB
CHUNK = 2 * 64 * 128 * 2
ENGINE = 7


def runtime(tmp_path, budget, pinned, slab_chunks=4, request="auto", engine=ENGINE):
    ledger = HostLedger(str(tmp_path / "ledger"), budget)
    rt = KVFlashRuntime(PagerConfig(pool_tokens=384), "lru", [], PACKED_LAYOUT, 128, 16, 4, host_pinned=pinned,
                        max_model_len=4096, ledger=ledger, engine=engine, host_request=request)
    rt._host_pools[(SHAPE, DTYPE)] = PinnedChunkPool(SHAPE, DTYPE, pin=False, slab_bytes=slab_chunks * CHUNK)
    return rt, ledger


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def logs():
    """vllm-luce's log lines (its logger is vLLM's child, which does not propagate to pytest's capture)."""
    logger, handler = logging.getLogger("vllm.luce"), Lines()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_auto_pins_one_longest_request_and_the_ledger_holds_exactly_that(tmp_path, logs):
    rt, ledger = runtime(tmp_path, 1 << 30, "auto")
    rt.pin_host_memory(SHAPE, DTYPE)
    chunks = (4096 - 384) // 64  # what a 4096-token request pages out beyond the 384-token pool
    assert rt.pinned_bytes() == chunks * CHUNK == ledger.mine("pinned", ENGINE)
    assert any(line.endswith("KVFlash: pinning host memory for paged-out KV (0.0 GiB, about 0 s)")
               for line in logs.lines), logs.text  # the start line, then the time taken
    assert "KVFlash: pinned 0.0 GiB in " in logs.lines[-1]


def test_the_host_budget_leaves_less_to_pin_and_says_so(tmp_path, logs):
    rt, ledger = runtime(tmp_path, 10 * CHUNK + 5, 40 * CHUNK, request=2 * CHUNK)
    assert ledger.hold("pageable", 3 * CHUNK, engine=99)  # another engine's page-outs
    rt.pin_host_memory(SHAPE, DTYPE)
    assert rt.pinned_bytes() == 5 * CHUNK == ledger.mine("pinned", ENGINE)  # one request's share left unpinned
    assert "luce.kvflash.host_bytes" in logs.text and "luce.kvflash.host_pinned_bytes" in logs.text
    assert "keeping one request's share (0.0 GiB) unpinned" in logs.text


def test_eight_servers_pinning_auto_leave_every_server_room_for_one_request_s_share(tmp_path):
    """Pinned memory is a server's until it exits: servers pinning one after another stop one request's share short
    of the budget, so a request of the last of them still gets its share (before: 3 pinned it all, 5 got nothing)."""
    budget, share = 128 * CHUNK, 58 * CHUNK  # auto: what a 4096-token request pages out beyond the 384-token pool
    pinned = []
    for engine in range(8):
        rt, ledger = runtime(tmp_path, budget, "auto", engine=engine)  # one ledger file: one host
        rt.pin_host_memory(SHAPE, DTYPE)
        pinned.append(rt.pinned_bytes() // CHUNK)
    assert pinned == [58, 12, 0, 0, 0, 0, 0, 0] and ledger.held() == 70 * CHUNK
    assert ledger.hold("pageable", share, engine=7)  # the last server's request gets its whole share


def test_a_failure_to_pin_is_reported_as_one_and_the_ledger_keeps_what_was_pinned(tmp_path, logs, monkeypatch):
    rt, ledger = runtime(tmp_path, 1 << 30, 12 * CHUNK)
    made = []
    empty = torch.empty

    def failing_after_one_slab(*args, pin_memory=False, **kwargs):
        if pin_memory is not None and len(made) == 1 and args and isinstance(args[0], tuple):
            raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")
        tensor = empty(*args, **kwargs)
        if args and isinstance(args[0], tuple):
            made.append(tensor)
        return tensor

    monkeypatch.setattr(torch, "empty", failing_after_one_slab)
    rt.pin_host_memory(SHAPE, DTYPE)
    monkeypatch.undo()
    assert rt.pinned_bytes() == 4 * CHUNK == ledger.mine("pinned", ENGINE)  # one slab of 4 chunks, then the failure
    assert "could not pin" in logs.text and "luce.kvflash.host_pinned_bytes" in logs.text
    assert "warm-up failed" not in logs.text
