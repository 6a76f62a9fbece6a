"""KVFlash's host memory settings resolved from the configuration and the machine."""

from vllm_luce.kvflash.settings import resolve_host_bytes, resolve_pinned_bytes

GIB = 1 << 30


def test_host_bytes_auto_is_half_the_available_memory_split_between_local_ranks(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000000 kB\nMemAvailable:    800000 kB\n")
    assert resolve_host_bytes("auto", 1, str(meminfo)) == 800000 * 1024 // 2
    assert resolve_host_bytes("auto", 4, str(meminfo)) == 800000 * 1024 // 8
    assert resolve_host_bytes(12345, 4, str(meminfo)) == 12345


def test_pinned_bytes_auto_is_one_longest_request_beyond_the_pool_in_whole_chunks():
    chunk = 9_437_184  # one 64-token chunk of the 8B shape (36 layers, K and V, 8 heads of 128, bf16)
    assert resolve_pinned_bytes("auto", 200 * GIB, chunk, 135_168, 4096, 64) == (135_168 - 4096) // 64 * chunk
    assert resolve_pinned_bytes("auto", 200 * GIB, chunk, 4096 + 65, 4096, 64) == 2 * chunk  # a partial chunk
    assert resolve_pinned_bytes("auto", 200 * GIB, chunk, 2048, 4096, 64) == 0  # every request fits the pool


def test_pinned_bytes_never_exceed_the_host_budget():
    assert resolve_pinned_bytes("auto", 3 * GIB, 9_437_184, 1 << 20, 4096, 64) == 3 * GIB
    assert resolve_pinned_bytes(80 * GIB, 10 * GIB, 1, 1, 1, 1) == 10 * GIB
    assert resolve_pinned_bytes(0, 10 * GIB, 1, 1 << 20, 1, 1) == 0
    assert resolve_pinned_bytes(5, None, 1, 1, 1, 1) == 5
