"""KVFlash's plan: what every KVFlash process derives from the resolved settings and the speculation, derived by one
function (``plan_of``, pure: no vLLM import).

The config-parsing process builds it first (``install.check_kvflash``), so a bad setting stops startup there. The
engine core's scheduler and the workers are other processes: each gets the same plan by calling ``plan_of`` on the
LuceConfig the first process attached to the VllmConfig (``LuceConfig.attach``) and that VllmConfig's speculation, of
which the plan is a function. No site derives a piece of it on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_luce.kvflash.pager import KVFlashConfigError, PagerConfig

PAGE, SFI = "page", "sfi"


@dataclass(frozen=True)
class KVFlashPlan:
    pager: PagerConfig
    selection: str  # PAGE: cold chunks leave the pool; SFI: every block resident, decode attends to the pool
    policy: str  # lru, qk, bounds, salient, attention or scorer (policies.make_policy)
    query_window: int  # tokens whose queries a reselection scores with
    draft_tokens: int  # the most draft tokens a verify step holds for a request (0 without speculation)
    audit: bool  # the block ownership audit (audit.py)

    @property
    def sfi(self) -> bool:
        return self.selection == SFI

    @property
    def pages(self) -> bool:
        """Cold chunks page out of the pool (to lent blocks or the host): the scheduler's hooks and the tiers apply."""
        return self.selection == PAGE

    @property
    def scorer(self) -> bool:
        """The policy is PFlash's drafter scorer, loaded on the runner (``scorer_policy.py``)."""
        return self.policy == "scorer"

    @property
    def resident_cap_tokens(self) -> int:
        """The most full-attention tokens a request keeps in vLLM's KV blocks: the pool when paging; 0 (no cap) with
        SFI, which keeps every block resident and applies the pool as the decode steps' attention budget."""
        return 0 if self.sfi else self.pager.pool_tokens


def build_plan(kvflash: Any, draft_tokens: int = 0) -> KVFlashPlan:
    """The plan of the KVFlash settings ``kvflash`` with ``draft_tokens`` drafts a step. Raises KVFlashConfigError,
    naming the key, where the pool is invalid, the policy needs SFI, or a paged step's tokens do not fit the pool."""
    pager = PagerConfig(pool_tokens=kvflash.pool_tokens, chunk_tokens=kvflash.chunk_tokens,
                        sink_chunks=kvflash.sink_chunks, recent_chunks=kvflash.recent_chunks)
    plan = KVFlashPlan(pager=pager, selection=kvflash.selection, policy=kvflash.policy,
                       query_window=kvflash.query_window, draft_tokens=int(draft_tokens), audit=bool(kvflash.audit))
    if plan.policy == "attention" and not plan.sfi:
        raise KVFlashConfigError("luce.kvflash.policy: got 'attention'; it reads every chunk's keys, which only "
                                 "selection 'sfi' keeps resident (page mode keeps cold chunks on the host): set "
                                 "luce.kvflash.selection to 'sfi', or use 'qk'")
    if plan.pages and pager.max_step_tokens <= plan.draft_tokens:
        raise KVFlashConfigError(f"luce.kvflash.pool_tokens: got {pager.pool_tokens}; a step writes up to "
                                 f"{plan.draft_tokens + 1} tokens with speculation, so the pool needs at least "
                                 f"{plan.draft_tokens + 1 + (pager.sink_chunks + 2) * pager.chunk_tokens} tokens")
    return plan


def draft_tokens(vllm_config: Any) -> int:
    """The most draft tokens a verify step holds for a request (0 without speculative decoding)."""
    spec = getattr(vllm_config, "speculative_config", None)
    return int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0


def plan_of(luce: Any, vllm_config: Any) -> KVFlashPlan:
    """The plan of these resolved settings and this VllmConfig's speculation: every process derives the same one."""
    return build_plan(luce.kvflash, draft_tokens(vllm_config))
