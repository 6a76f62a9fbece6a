"""The gate binding's verify metrics: tallied per step, published with the report, with the same totals
(drafts, verified and accepted tokens, and accepted tokens per draft position) as per-step writes."""

from types import SimpleNamespace

from vllm_luce.spec_decode import scheduler as S


def test_verify_tallies_publish_the_per_position_acceptance_once(monkeypatch):
    written = []
    monkeypatch.setattr(S.metrics, "inc", lambda name, value=1.0, **labels: written.append((name, value, labels)))
    fake = SimpleNamespace(_luce_labels={"model_name": "m"}, _luce_verified=0, _luce_accepted_counts={})
    for verified, accepted in ((15, 3), (15, 0), (7, 7), (15, 3)):
        S.DFlashGateMixin._luce_count_verify(fake, verified, accepted)
    assert written == []  # nothing per step
    S.DFlashGateMixin._luce_publish_verify(fake)
    totals = {(n, l.get("position")): v for n, v, l in written}
    assert totals[("dflash_drafts", None)] == 4
    assert totals[("dflash_verified_tokens", None)] == 52 and totals[("dflash_accepted_tokens", None)] == 13
    # position p counts the steps that accepted more than p drafts
    assert [totals[("dflash_accepted_tokens_per_pos", p)] for p in range(7)] == [3, 3, 3, 1, 1, 1, 1]
    assert sum(totals[("dflash_accepted_tokens_per_pos", p)] for p in range(7)) == 13
    written.clear()
    S.DFlashGateMixin._luce_publish_verify(fake)  # the tally was reset
    assert written == []
