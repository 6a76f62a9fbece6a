"""Timing helpers shared by the GPU benchmarks: CUDA-event timing and the device's copy bandwidth."""

from __future__ import annotations

import torch


def timed(fn, reps: int, warmup: int = 3) -> float:
    """Mean milliseconds of ``fn()`` over ``reps`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def device_info() -> dict:
    """The header every GPU benchmark's JSON starts with: device, torch version and date."""
    import time

    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}


def copy_bandwidth(device="cuda") -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write)."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    return 2 * x.numel() / (timed(lambda: y.copy_(x), 20) / 1e3)


def timed_graph(fn, reps: int, warmup: int = 3) -> float:
    """Mean milliseconds of ``fn()`` replayed from a CUDA graph (as vLLM runs decode), so that Python
    launch overhead does not count; ``fn`` runs eagerly ``warmup`` times first (autotuning)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return timed(graph.replay, reps, warmup=1)
