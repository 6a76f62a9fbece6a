"""The GPU tier's comparisons of two runs (tests/gpu is skipped without CUDA; these decide its verdicts)."""

from tests.gpu.conftest import TIE_GAP, drift_and_ties, parts
from tests.gpu.test_kvflash import selections_part


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


def test_selections_part_finds_the_earliest_rank_and_the_chunks_swapped():
    same = [100, [0], [0, 1, 2]]
    graphs = [[[same, [170, [0, 1, 2], [0, 1, 3]]]], [[same, [140, [0, 1, 2], [0, 4, 5]]]]]
    graphless = [[[same, [170, [0, 1, 2], [0, 1, 4]]]], [[same, [140, [0, 1, 2], [0, 1, 2]]]]]
    assert selections_part(graphs, graphless, [100]) == [{"position": 40, "rank": 1, "swapped": 2}]
    assert selections_part(graphs, graphs, [100]) == [None]
