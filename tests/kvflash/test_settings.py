"""KVFlash's host memory settings resolved from the configuration and the machine."""

from vllm_luce.kvflash.settings import AUTO_PINNED_BYTES, resolve_host_bytes, resolve_pinned_bytes


def test_host_bytes_auto_is_half_the_available_memory_split_between_local_ranks(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000000 kB\nMemAvailable:    800000 kB\n")
    assert resolve_host_bytes("auto", 1, str(meminfo)) == 800000 * 1024 // 2
    assert resolve_host_bytes("auto", 4, str(meminfo)) == 800000 * 1024 // 8
    assert resolve_host_bytes(12345, 4, str(meminfo)) == 12345


def test_pinned_bytes_auto_is_16_gib_and_never_more_than_the_host_budget():
    assert AUTO_PINNED_BYTES == 16 << 30
    assert resolve_pinned_bytes("auto", 100 << 30) == 16 << 30
    assert resolve_pinned_bytes("auto", 3 << 30) == 3 << 30
    assert resolve_pinned_bytes(0, 100 << 30) == 0
    assert resolve_pinned_bytes(80 << 30, 10 << 30) == 10 << 30
