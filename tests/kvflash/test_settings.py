"""KVFlash's host memory settings resolved from the configuration and the machine."""

from vllm_luce.kvflash.host_ledger import HostLedger
from vllm_luce.kvflash.settings import ledger_path, resolve_pinned_bytes, resolve_request_bytes

GIB = 1 << 30


def test_host_bytes_auto_is_half_the_available_memory_when_the_first_server_starts(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000000 kB\nMemAvailable:    800000 kB\n")
    first = HostLedger(str(tmp_path / "ledger"), "auto", meminfo=str(meminfo), container=False)
    assert first.budget == 800000 * 1024 // 2
    assert first.hold("pinned", 1)
    meminfo.write_text("MemTotal:       1000000 kB\nMemAvailable:    100000 kB\n")
    later = HostLedger(str(tmp_path / "ledger"), "auto", meminfo=str(meminfo), container=False)
    assert later.budget == 800000 * 1024 // 2


def test_a_request_s_share_is_a_quarter_of_the_budget_or_one_longest_request_at_most_half():
    assert resolve_request_bytes("auto", 100 * GIB, 10 * GIB) == 25 * GIB
    assert resolve_request_bytes("auto", 100 * GIB, 40 * GIB) == 40 * GIB
    assert resolve_request_bytes("auto", 20 * GIB, 40 * GIB) == 10 * GIB  # never the whole budget: half of it
    assert resolve_request_bytes("auto", 60 * GIB, 40 * GIB) == 30 * GIB
    assert resolve_request_bytes(5 * GIB, 20 * GIB, 40 * GIB) == 5 * GIB
    assert resolve_request_bytes(50 * GIB, 20 * GIB, 40 * GIB) == 20 * GIB


def test_the_ledger_lives_in_the_temp_folder_where_dev_shm_does_not_exist(tmp_path):
    assert ledger_path(str(tmp_path / "ledger")) == str(tmp_path / "ledger")
    assert ledger_path("/no/such/folder/ledger").endswith("/ledger")
    assert not ledger_path("/no/such/folder/ledger").startswith("/no/")


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
