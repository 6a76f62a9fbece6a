"""A row vLLM reads at slot 0 after its request's verify step reads the recurrent state of that step's last accepted
token once moved (spec_decode/recurrent_state.py), checked against the committed token stream itself."""

import pytest
import torch

from vllm_luce.spec_decode.recurrent_state import realign, rows_to_realign

WIDTH, K, DIM = 4, 5, 3  # conv kernel width, drafts per verify step, conv channels


def committed_inputs(request: int, count: int) -> torch.Tensor:
    """A request's conv inputs, one per committed token: [DIM, count], distinct everywhere."""
    return 1000.0 * request + torch.arange(count * DIM, dtype=torch.float32).view(count, DIM).T


def verified_state(request: int, before: int, accepted: int, dim_first: bool, nan_tail: bool = True):
    """The conv buffer and ssm slots a verify step of 1 + K inputs leaves, as vLLM lays them out: the conv buffer
    holds the WIDTH - 2 inputs before the step then the step's inputs (of which the first ``accepted`` are
    committed; the rest are rejected drafts, NaN here so that reading one shows); ssm slot i holds the state after
    the step's input i (here: that input's position in the stream)."""
    stream = committed_inputs(request, before + accepted)
    drafts = torch.full((DIM, 1 + K - accepted), float("nan") if nan_tail else -1.0)
    buffer = torch.cat([stream[:, before - (WIDTH - 2):], drafts], dim=1)  # [DIM, WIDTH - 2 + 1 + K]
    ssm = torch.stack([torch.full((2, 2), float(before + i)) for i in range(1 + K)])
    return (buffer if dim_first else buffer.T.contiguous()), ssm


@pytest.mark.parametrize("dim_first", [True, False])
def test_the_plain_read_after_realign_is_the_committed_history(dim_first):
    accepted = [3, 1, 6]  # tokens each row kept: 2 drafts and the bonus; none; every draft
    blocks = 2 + (1 + K) * len(accepted)
    conv_shape = (DIM, WIDTH - 2 + 1 + K) if dim_first else (WIDTH - 2 + 1 + K, DIM)
    conv = torch.full((blocks, *conv_shape), -7.0)
    ssm = torch.full((blocks, 2, 2), -7.0)
    slots = torch.zeros(len(accepted), 1 + K + 2, dtype=torch.int32)  # rows wider than 1 + K, as block tables are
    for row, a in enumerate(accepted):
        ids = torch.arange(1 + K) + 2 + row * (1 + K)
        ids = ids.flip(0) if row == 1 else ids  # slots need not be ordered
        slots[row, :1 + K] = ids
        buffer, states = verified_state(row, before=10 + row, accepted=a, dim_first=dim_first)
        conv[ids[0]] = buffer
        ssm[ids] = states
    untouched_conv, untouched_ssm = conv[:2].clone(), ssm[:2].clone()

    realign(conv, ssm, slots, torch.tensor(accepted), WIDTH - 1, dim_first)

    for row, a in enumerate(accepted):
        first = int(slots[row, 0])
        window = conv[first][:, :WIDTH - 1] if dim_first else conv[first][:WIDTH - 1].T
        history = committed_inputs(row, 10 + row + a)[:, -(WIDTH - 1):]  # what a decode of the next token must see
        assert torch.equal(window, history), (row, window, history)
        assert torch.equal(ssm[first], torch.full((2, 2), float(10 + row + a - 1))), row
    assert torch.equal(conv[:2], untouched_conv) and torch.equal(ssm[:2], untouched_ssm)


def test_a_row_that_kept_one_token_is_left_as_it_is():
    conv, ssm = torch.randn(8, DIM, WIDTH - 1 + K), torch.randn(8, 2, 2)
    before = conv.clone(), ssm.clone()
    realign(conv, ssm, torch.tensor([[3, 4, 5, 6, 7, 0]]), torch.tensor([1]), WIDTH - 1, True)
    assert torch.equal(conv, before[0]) and torch.equal(ssm, before[1])


def test_rows_to_realign_are_those_vllm_reads_at_slot_0_after_their_verify_step():
    req_ids = ["a", "b", "c", "d", "e", "f"]
    drafts_now = {"b": [5, 6], "d": [], "e": [1], "f": [2]}
    verified = {"a": True, "b": True, "c": False, "d": True, "e": True, "f": False}
    previous = {"a", "b", "c", "d", "f"}
    # a: verified, no drafts now; b: drafts now after a verify in the step before (vLLM reads slot a - 1); c: did
    # not verify; d: an empty draft list is no drafts; e: back after a step away, drafting; f: last step was plain
    assert rows_to_realign(previous, verified, req_ids, drafts_now) == [0, 3, 4]
    assert rows_to_realign(set(req_ids), {}, req_ids, drafts_now) == []
