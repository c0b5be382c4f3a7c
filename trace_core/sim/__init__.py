"""A synthetic agentic environment for allocation studies (method §1–§4, §7).

Each prompt has a hidden difficulty and a horizon; each turn moves a hidden success probability
``V_t`` as a bounded martingale, so ``V_t = E[r | H_t]`` holds *exactly* (method §1's definition)
and the contrast potential ``V_t(1 − V_t)`` decays towards the end of a path:

- difficulty ``p0 = V_0 ~ Beta(a, a)`` with ``a = 0.15`` (U-shaped: most prompts are nearly
  always or never solved, so uniform sampling wastes most groups);
- horizon ``T ~ uniform{3..8}``, shared by every path of the prompt (a continuation branched at
  turn ``t`` runs turns ``t+1..T``);
- ``V_{t+1} ~ Beta(κ V_t, κ (1 − V_t))`` with ``κ = 6`` (mean ``V_t``: a martingale), 0 and 1
  absorbing;
- reward ``r ~ Bernoulli(V_T)`` at the terminal turn ``T``.

A real predictor could not see ``V``. What it may see: a prompt feature
``logit(p0) + N(0, 1)`` (standard deviation 1) and, at each turn, an observation
``V_t + N(0, 0.25)`` (standard deviation 0.25, not variance). The defaults are pinned in
:class:`SimConfig` (frozen) so that results cannot be tuned after the fact; change them only to
run a declared sensitivity study.

:func:`run_step` runs one step of method §2–§4 for any method of the allocation registry,
taking every rule from its :class:`~trace_core.methods.Method` as the trainer does: sample a
shuffled candidate pool, score the roots, allocate ``m``, roll out the bare paths, score the
anchors, allocate ``K`` per prompt (method §3, including the no-anchor rule), roll out the
continuations, build real :class:`~trace_core.tree.RolloutTree` objects (empty token lists; in
``node.info`` only what a predictor may see — each turn's observation, the root's feature and
horizon — while the hidden ``V_t`` stays beside the trees, in ``StepResult.node_value``),
compute method §7's metrics under the trainer's names (:func:`~trace_core.metrics.step_metrics`),
and only then let the predictor learn from the step's trees — so every prediction used for allocation or reported in the
metrics is out-of-sample.

Two modes for the candidate pool:

- **i.i.d.** (the default, ``pool=None``): every step draws fresh prompts from the prior, so no
  prompt recurs and a method that remembers prompts collapses to one that does not;
- **persistent** (``pool=PersistentPool(...)``): a finite dataset of ``dataset_factor ×`` the
  candidate pool, walked epoch by epoch in a fresh random order (every prompt is a candidate
  once per epoch of ``dataset_factor`` steps), whose success probabilities drift as training
  proceeds (:class:`PersistentPoolConfig`: in logit space, a small drift of every prompt towards
  success, per-step Gaussian noise, and a larger push for each prompt that formed a trained
  mixed group that step). A prompt's visible feature is its *current* logit plus an error drawn
  once per prompt — a predictor's persistent misjudgement of it, which only the prompt's own
  outcomes can correct. A :class:`~trace_core.history.PromptHistory` passed beside the pool
  records each step's bare root outcomes for the methods that read history (GRESO, the posterior
  roots).

Methods that sample in rounds (DAPO's dynamic sampling) run their rounds here: the bare groups of
a round are rolled out before the next round is chosen; the method's group filter decides
which groups count as trained (``StepResult.tree_kept``), and the budget is a cap for them.

Generated tokens (method §10): each prompt has a typical length per turn, drawn when the prompt is
created (:func:`draw_turn_tokens`), and every generated turn a fresh factor around it
(:func:`path_tokens`); a rollout costs the sum over the turns it generates, so a continuation from
a late turn costs only its remaining turns. These draws come from a generator of their own (spawned
from the step's, or the persistent pool's), so every path, allocation and figure of a method is
what it is without them. :class:`TokenLedger` carries the cost estimates across steps, and
:func:`run_step` runs ``trace-tokens`` — and GRPO or PCL at an equal token budget — under
``BudgetSpec.tokens_per_step``.

Sampling is vectorised over paths (a Python loop runs over the ≤ ``horizon_max`` turns); trees
are built in a light loop over nodes. Everything is seeded: the same generator state, method,
budget and predictor (and pool and history state) give the same :class:`StepResult`.
"""

from __future__ import annotations

from trace_core.sim.predictors import (
    DEFAULT_NOISE_STD,
    HistoryBatch,
    LearnedPredictor,
    LearnedPredictorConfig,
    NoisyPredictor,
    OraclePredictor,
    ValuePredictor,
    make_predictor,
    supervised_histories,
    tree_histories,
    visible_features,
)
from trace_core.sim.step import (
    StepResult,
    run_step,
    sim_token_ledger,
    simulator_metrics,
)
from trace_core.sim.world import (
    Paths,
    PersistentPool,
    PersistentPoolConfig,
    PromptPool,
    SimConfig,
    draw_turn_tokens,
    expected_rollout_tokens,
    martingale_step,
    path_tokens,
    sample_prompts,
    simulate_paths,
)

__all__ = [
    "DEFAULT_NOISE_STD",
    "HistoryBatch",
    "LearnedPredictor",
    "LearnedPredictorConfig",
    "NoisyPredictor",
    "OraclePredictor",
    "Paths",
    "PersistentPool",
    "PersistentPoolConfig",
    "PromptPool",
    "SimConfig",
    "StepResult",
    "ValuePredictor",
    "draw_turn_tokens",
    "expected_rollout_tokens",
    "make_predictor",
    "martingale_step",
    "path_tokens",
    "run_step",
    "sample_prompts",
    "sim_token_ledger",
    "simulate_paths",
    "simulator_metrics",
    "supervised_histories",
    "tree_histories",
    "visible_features",
]
