"""The GPU tier's comparisons of two runs (tests/gpu is skipped without CUDA; these decide its verdicts)."""

import json
from pathlib import Path

from tests.gpu.conftest import TIE_GAP, drift_and_ties, first_parts, parts
from tests.gpu.test_kvflash import SCORE_TOLERANCE, compare_selections

RECORDED = Path(__file__).resolve().parents[1] / "docs" / "data" / "gpu" / "graphs_follow_494f318.json"


def run(tokens, logprobs, top_ids=None):
    return {"tokens": tokens, "logprobs": logprobs, "top_ids": top_ids}


def test_parts_accepts_only_a_mutual_top_two_near_tie():
    same = [[-0.1, -0.1, -2.0]]
    a = run([[5, 7]], [same + [[-0.70, -0.70, -0.72]]], [[[5, 9], [7, 8]]])
    tied = run([[5, 8]], [same + [[-0.71, -0.71, -0.72]]], [[[5, 9], [8, 7]]])
    assert parts(a, a) == []
    (found,) = parts(a, tied)
    assert (found["request"], found["position"], found["tie"]) == (0, 1, True)
    wide = run([[5, 8]], [same + [[-0.1, -0.1, -0.1 - 2 * TIE_GAP]]], [[[5, 9], [8, 7]]])
    assert not parts(a, wide)[0]["tie"]  # the other run was sure of its token
    elsewhere = run([[5, 3]], [same + [[-0.71, -0.71, -0.72]]], [[[5, 9], [3, 4]]])
    assert not parts(a, elsewhere)[0]["tie"]  # its token is not a's second


def test_drift_stops_where_asked():
    a = run([[1, 2, 3]], [[[-1.0, -1.0, -3.0], [-1.0, -1.0, -3.0], [-1.0, -1.0, -3.0]]])
    b = run([[1, 2, 4]], [[[-1.01, -1.01, -3.0], [-1.5, -1.5, -3.0], [-1.0, -1.0, -1.0]]])
    drift, gaps = drift_and_ties(a, b)
    assert abs(drift - 0.5) < 1e-9 and gaps == [0.0]
    drift, gaps = drift_and_ties(a, b, upto=[1])
    assert abs(drift - 0.01) < 1e-9 and gaps == []


def test_compare_selections_stops_at_the_part_and_measures_scores_until_then():
    scores = {"1": 2.0, "2": 1.0, "3": 0.5}
    near = {"1": 1.98, "2": 1.01, "3": 0.5}  # one chunk's salient key flipped would move one score far: the median
    graphs = [[[[100, [0], [0, 1], scores], [172, [0, 1], [0, 2], scores], [244, [0, 2], [0, 3], scores]]]]
    graphless = [[[[100, [0], [0, 1], near], [172, [0, 1], [0, 3], {**near, "3": 9.0}], [244, [0, 3], [0, 2], {}]]]]
    (found,) = compare_selections(graphs, graphless, [100], [None])
    assert found["position"] == 72 and found["decode_time"] and abs(found["score_error"] - 0.01) < 1e-9
    (same,) = compare_selections(graphs, graphs, [100], [None])
    assert same == {"position": None, "score_error": 0.0, "decode_time": True}
    unrelated = {"1": 0.4, "2": 1.6, "3": 1.1}  # another token's queries move every chunk's score
    (stale,) = compare_selections([[[[100, [0], [0, 1], scores]]]], [[[[100, [0], [0, 1], unrelated]]]], [100],
                                  [None])
    assert stale["score_error"] > SCORE_TOLERANCE and not stale["decode_time"]


def test_compare_selections_stops_where_the_tokens_part():
    scores, other = {"1": 2.0, "2": 1.0}, {"1": 0.4, "2": 1.6}
    graphs = [[[[100, [0], [0, 1], scores], [150, [0, 1], [0, 2], scores]]]]
    graphless = [[[[100, [0], [0, 1], scores], [150, [0, 1], [0, 1], other]]]]
    (parted,) = compare_selections(graphs, graphless, [100], [50])  # the second reads outputs 0..49 (positions < 150)
    assert parted["position"] == 50 and parted["score_error"] > SCORE_TOLERANCE
    (stopped,) = compare_selections(graphs, graphless, [100], [49])
    assert stopped == {"position": None, "score_error": 0.0, "decode_time": False}
    assert first_parts([[1, 2, 3], [4, 5]], [[1, 2, 9], [4, 5]]) == [2, None]


def test_the_recorded_h200_runs_pass_once_reselections_after_a_token_part_are_left_out():
    """The recorded GPU runs (``RECORDED``, its provenance in the file: TP=1 and TP=2, both runners) fail the score
    rule only at decode-time reselections after their tokens parted at an exact tie; every reselection both made
    from the same tokens agrees within 0.25% of the largest score, and a decode-time one is among them."""
    data = json.loads(RECORDED.read_text())
    for name, run in data["runs"].items():
        graphs, graphless = run["selections"]
        before = compare_selections(graphs, graphless, data["prompt_tokens"], [None] * 4)
        assert before == run["verdict_then"] and any(c["score_error"] > SCORE_TOLERANCE for c in before), name
        found = compare_selections(graphs, graphless, data["prompt_tokens"], first_parts(*run["tokens"]))
        assert all(c["score_error"] <= 0.0025 for c in found) and any(c["decode_time"] for c in found), (name, found)
        assert run["drift"] <= run["tolerance"] and all(g <= 2 * run["tolerance"] for g in run["gaps"]), name


def test_the_results_table_reads_a_run_packed_in_logs_tgz_or_left_loose(tmp_path):
    """scripts/gpu_tier.sh packs device.txt and junit.xml into logs.tgz (two result files per run, not four);
    runs recorded before left them beside it: scripts/gpu_results.py reads both."""
    import subprocess
    import sys
    import tarfile

    junit = ('<testsuites><testsuite name="pytest"><testcase classname="tests.gpu.test_kvflash" name="test_a" '
             'time="12.3"/><testcase classname="tests.gpu.test_dflash" name="test_b" time="4"><failure '
             'message="assert 1 == 2"/></testcase></testsuite></testsuites>')
    logs, loose, packed = tmp_path / "logs", tmp_path / "loose", tmp_path / "packed"
    for folder in (logs, loose, packed):
        folder.mkdir()
    for folder in (logs, loose):
        (folder / "device.txt").write_text("NVIDIA H100 80GB HBM3, 81559 MiB\nvllm 0.26.0 torch 2.11.0\ncommit abc\n")
        (folder / "junit.xml").write_text(junit)
    with tarfile.open(packed / "logs.tgz", "w:gz") as tar:
        tar.add(logs, arcname=".")
    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_results.py"
    tables = [subprocess.run([sys.executable, str(script), str(folder), "TP=1"], capture_output=True, text=True,
                             check=True).stdout for folder in (loose, packed)]
    assert tables[0] == tables[1]
    assert "1 failed, 1 passed" in tables[0] and "| `test_dflash::test_b` | failed | 4 | assert 1 == 2 |" in tables[0]
    assert "- commit abc" in tables[0]
