"""The per-step budget every method shares (method §4), so that their costs are equal."""

from __future__ import annotations

from dataclasses import dataclass

from trace_core.allocation.checks import as_int


@dataclass(frozen=True)
class BudgetSpec:
    """Per-step rollout budget, shared by every method so that costs are equal (method §4)."""

    roots_M: int  # M: TRACE's root budget (bare rollouts); the total is M(1+N) trajectories
    expansion_N: int  # N: expansion factor; TRACE spends m_i·N continuations on prompt i
    group_size_G: int = 8  # G: rollouts per prompt for the uniform baselines (GRPO, PCL, TreePO)
    max_per_prompt: int = 16  # M_max: largest m_i TRACE may give one prompt
    pool_factor: int = 4  # candidate pool B = pool_factor·M(1+N)/G (PCL's k = 4)
    # T: the budget in generated tokens per step (method §10), for a method that prices rollouts in
    # tokens (``Method.token_rule``) and for uniform methods run at equal tokens
    # (trace_core.token_budget.uniform_spec_for_tokens); the fields above still define the candidate
    # pool and G. None: the budget is M(1+N) trajectories.
    tokens_per_step: int | None = None

    def __post_init__(self) -> None:
        for name in ("roots_M", "expansion_N", "group_size_G", "max_per_prompt", "pool_factor"):
            as_int(getattr(self, name), name)
        if self.tokens_per_step is not None and as_int(self.tokens_per_step, "tokens_per_step") < 1:
            raise ValueError(f"tokens_per_step = {self.tokens_per_step}: a token budget must be >= 1 token "
                             "(None: a budget in trajectories)")
        if self.roots_M < 2:
            raise ValueError(f"roots_M = {self.roots_M}: the root budget M must be >= 2")
        if self.expansion_N < 0:
            raise ValueError(f"expansion_N = {self.expansion_N}: the expansion factor cannot be negative")
        if self.group_size_G < 2:
            raise ValueError(f"group_size_G = {self.group_size_G}: a group needs >= 2 rollouts")
        if self.roots_M % self.group_size_G:
            raise ValueError(
                f"roots_M = {self.roots_M} is not divisible by group_size_G = {self.group_size_G} "
                "(the uniform baselines need M/G and M(1+N)/G whole prompts)"
            )
        if self.max_per_prompt < 2:
            raise ValueError(f"max_per_prompt = {self.max_per_prompt}: it must be >= 2")
        if self.pool_factor < 1:
            raise ValueError(f"pool_factor = {self.pool_factor}: it must be >= 1")

    @property
    def total(self) -> int:
        """Trajectories per step, for every method: M(1+N)."""
        return self.roots_M * (1 + self.expansion_N)

    @property
    def prices_tokens(self) -> bool:
        """Whether the budget is counted in generated tokens (``tokens_per_step``)."""
        return self.tokens_per_step is not None

    @property
    def pool_size(self) -> int:
        """Candidate pool B = pool_factor·M(1+N)/G."""
        return self.pool_factor * self.total // self.group_size_G
