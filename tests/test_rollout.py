"""Tree rollouts end to end on a real (tiny, random) Qwen3 through the session's vLLM engine."""

from __future__ import annotations

import time

import numpy as np
import pytest

from trace_core.allocation import BudgetSpec, GresoRoots, RoundLimits
from trace_core.history import GresoConfig, PromptHistory
from trace_core.methods import METHODS, get_method
from trace_core.rollout.agent import AgentConfig, observation_text
from trace_core.rollout.env import Action, FixedTurnsEnvironment, Observation, Task, parse_action
from trace_core.rollout.executor import TreeRolloutExecutor, expansion_of
from trace_core.tree import ROOT

AGENT = AgentConfig(max_turns=8, max_new_tokens=12, max_total_tokens=1024, temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def engine(vllm_engine):
    """The session's shared vLLM engine (prefix caching on)."""
    return vllm_engine


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer):
    return tiny_tokenizer


def tasks(n: int, turns: int | list[int] = 3) -> list[Task]:
    per = turns if isinstance(turns, list) else [turns] * n
    return [Task(id=f"q{i}", question=f"What is {i} + {i}?", answer=str(2 * i), metadata={"turns": per[i]})
            for i in range(n)]


def fixed_env(task: Task) -> FixedTurnsEnvironment:
    return FixedTurnsEnvironment(num_turns=task.metadata["turns"])


def random_scorer(tree, nodes) -> np.ndarray:
    rng = np.random.default_rng(len(tree.nodes))
    return rng.random(len(nodes))


def run(engine, tokenizer, method: str, m: list[int], n_expand: int, task_list, tool_workers: int = 0, seed=0):
    executor = TreeRolloutExecutor(engine, tokenizer, fixed_env, AGENT, tool_workers=tool_workers)
    return executor.run(task_list, m, expansion_of(get_method(method), n_expand, random_scorer),
                        np.random.default_rng(seed))


def test_trees_hold_exact_token_histories_and_masks(engine, tokenizer) -> None:
    result = run(engine, tokenizer, "trace", [2, 3], 2, tasks(2))
    assert len(result.trees) == 2
    for tree in result.trees:
        tree.validate()
        # Drift check: the engine received exactly the stored ids of the node it continued from.
        for node in tree.nodes:
            key = (tree.prompt_id, node.id)
            if key in result.received_histories:
                assert list(result.received_histories[key]) == tree.history_tokens(node.id)
        for node in tree.nodes[1:]:
            # Every child's history starts with its parent's history, token for token.
            parent = tree.history_tokens(node.parent)
            assert tree.history_tokens(node.id)[: len(parent)] == parent
            n_model = sum(node.loss_mask)
            # Model tokens come first (mask 1), observation tokens after them (mask 0).
            assert node.loss_mask == [1] * n_model + [0] * (len(node.token_ids) - n_model)
            if not node.terminal:
                obs = tokenizer.decode(node.token_ids[n_model:])
                assert obs == observation_text(f"turn {node.depth - tree.nodes[0].depth} of 3")
            assert node.logprobs is not None and all(lp <= 0 for lp in node.logprobs[:n_model])
        # Fixed 3-turn episodes: every trajectory ends at depth 3; anchors at depths 1 and 2.
        assert {tree.nodes[leaf].depth for leaf in tree.leaves()} == {3}
        assert {tree.nodes[a].depth for a in tree.anchors()} <= {1, 2}


def test_malformed_actions_give_error_observations_and_the_rollout_goes_on(engine, tokenizer) -> None:
    result = run(engine, tokenizer, "grpo", [2], 0, tasks(1, turns=4))
    tree = result.trees[0]
    assert all(tree.nodes[leaf].depth == 4 for leaf in tree.leaves())
    assert result.stats.tool_errors == result.stats.turns > 0  # a random model writes no valid action
    assert parse_action('I think. <tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>').tool == "search"
    assert "not valid JSON" in parse_action("<tool_call>{oops</tool_call>").error
    assert parse_action("so <answer> 42 </answer>").final_answer == "42"


# a method priced in generated tokens (method §10) is not planned by the trainer's executor yet: its
# trajectory rules refuse
@pytest.mark.parametrize("method", sorted(n for n, m in METHODS.items() if not m.prices_tokens))
def test_every_method_spends_the_same_budget_through_the_executor(engine, tokenizer, method: str) -> None:
    spec = BudgetSpec(roots_M=8, expansion_N=1, group_size_G=4, max_per_prompt=4, pool_factor=1)
    rng = np.random.default_rng(0)
    v = rng.random(spec.pool_size)
    m = get_method(method).allocate_roots(v, spec, rng)
    result = run(engine, tokenizer, method, m.tolist(), spec.expansion_N, tasks(spec.pool_size, turns=2))
    assert result.stats.trajectories == spec.total == sum(len(t.trajectories) for t in result.trees)
    assert result.stats.generated_tokens == sum(t.num_generated_tokens() for t in result.trees)


def test_prompt_without_anchors_spends_its_budget_on_extra_root_rollouts(engine, tokenizer) -> None:
    result = run(engine, tokenizer, "trace", [2], 3, tasks(1, turns=1))
    tree = result.trees[0]
    assert tree.anchors() == []
    conts = [t for t in tree.trajectories if t.kind == "continuation"]
    assert len(conts) == 2 * 3 and all(t.branch_node == ROOT for t in conts)
    assert result.continuations_per_anchor["q0"] == {ROOT: 6}


def test_continuations_start_at_the_allocated_anchors(engine, tokenizer) -> None:
    result = run(engine, tokenizer, "trace", [4], 2, tasks(1, turns=3))
    tree = result.trees[0]
    k = result.continuations_per_anchor["q0"]
    assert sum(k.values()) == 8
    starts: dict[int, int] = {}
    for t in tree.trajectories:
        if t.kind == "continuation":
            starts[t.branch_node] = starts.get(t.branch_node, 0) + 1
            # A continuation runs to the episode's horizon from its anchor.
            assert tree.nodes[t.leaf].depth == 3
    assert starts == k


def test_same_seed_gives_the_same_trees(engine, tokenizer) -> None:
    a = run(engine, tokenizer, "trace", [3, 2], 2, tasks(2), seed=5)
    b = run(engine, tokenizer, "trace", [3, 2], 2, tasks(2), seed=5)

    def without_logprobs(tree) -> dict:
        d = tree.to_dict()
        for node in d["nodes"]:
            node.pop("logprobs")
        return d

    # Same tokens, structure, rewards and allocations; log-probs agree to float32 rounding (the
    # second run reads its prefixes from the prefix cache instead of recomputing them).
    assert [without_logprobs(t) for t in a.trees] == [without_logprobs(t) for t in b.trees]
    for ta, tb in zip(a.trees, b.trees, strict=True):
        for na, nb in zip(ta.nodes, tb.nodes, strict=True):
            np.testing.assert_allclose(na.logprobs or [], nb.logprobs or [], atol=1e-4)
    assert a.continuations_per_anchor == b.continuations_per_anchor


class SlowFirstTurnsEnvironment(FixedTurnsEnvironment):
    """The slow prompt's tool takes a while each turn (a long-running tool call)."""

    def _execute(self, action: Action) -> Observation:
        if self._task is not None and self._task.metadata.get("slow"):
            time.sleep(0.3)
        return super()._execute(action)


def test_other_prompts_expand_before_a_slow_prompt_finishes(engine, tokenizer) -> None:
    slow = Task(id="slow", question="slow one", metadata={"turns": 6, "slow": True})
    quick = [Task(id=f"fast{i}", question=f"fast {i}", metadata={"turns": 2}) for i in range(3)]

    def env_factory(task: Task) -> FixedTurnsEnvironment:
        return SlowFirstTurnsEnvironment(num_turns=task.metadata["turns"])

    executor = TreeRolloutExecutor(engine, tokenizer, env_factory, AGENT, tool_workers=4)
    result = executor.run([slow, *quick], [2, 2, 2, 2], expansion_of(get_method("trace"), 2, random_scorer),
                          np.random.default_rng(0))
    order = [(e.kind, e.prompt_id) for e in result.events]
    slow_bare_done = order.index(("bare_done", "slow"))
    fast_expansions = [i for i, (kind, pid) in enumerate(order) if kind == "expand" and pid.startswith("fast")]
    assert fast_expansions and min(fast_expansions) < slow_bare_done
    assert order[0] == ("submit_bare", "slow")  # it was submitted first


def test_bad_arguments_are_errors(engine, tokenizer) -> None:
    executor = TreeRolloutExecutor(engine, tokenizer, fixed_env, AGENT)
    with pytest.raises(ValueError, match="same length"):
        executor.run(tasks(2), [2], None, np.random.default_rng(0))
    with pytest.raises(ValueError, match="single rollout"):
        executor.run(tasks(1), [1], None, np.random.default_rng(0))
    with pytest.raises(ValueError, match="score_prefixes is required"):
        executor.run(tasks(1), [2], expansion_of(get_method("trace"), 2, None), np.random.default_rng(0))


def test_sampling_seed_keys_the_draws_and_repeated_prompts_are_rejected(engine, tokenizer) -> None:
    """A step's sampling seed reaches every request: the same seed draws the same tokens, another
    seed (another step, another run) draws others for the same prompt. One prompt twice in one
    call would share its seeds, so it is an error."""
    executor = TreeRolloutExecutor(engine, tokenizer, fixed_env, AGENT)

    def first(seed):
        res = executor.run(tasks(2), [4, 4], None, np.random.default_rng(0), sampling_seed=seed)
        return [tuple(t.nodes[tr.nodes[0]].token_ids) for t in res.trees for tr in t.trajectories]

    a, b, c = first(11), first(11), first(12)
    assert a == b
    assert a != c
    twice = [tasks(1)[0], tasks(1)[0]]
    with pytest.raises(ValueError, match="more than once"):
        executor.run(twice, [2, 2], None, np.random.default_rng(0))


# ---------------------------------------------------------------------------- sampling in rounds
def test_rounds_never_exceed_the_budget_and_dropped_groups_are_counted(engine, tokenizer) -> None:
    from trace_core.metrics import is_success

    spec = BudgetSpec(roots_M=8, expansion_N=1, group_size_G=4, max_per_prompt=4, pool_factor=2)
    dapo = get_method("dapo-capped")  # the budget-capped variant: M(1+N) is its cap
    rule = dapo.group_filter
    pool = tasks(spec.pool_size, turns=2)

    def rounds(success_rate: float):
        def env(task: Task) -> FixedTurnsEnvironment:
            return FixedTurnsEnvironment(num_turns=task.metadata["turns"], success_rate=success_rate)

        executor = TreeRolloutExecutor(engine, tokenizer, env, AGENT, tool_workers=0)
        return executor.run_in_rounds(pool, np.full(spec.pool_size, 0.5), dapo, spec, np.random.default_rng(0))

    def mixed(tree) -> bool:
        s = is_success(tree.outcomes())
        return bool(s.any() and not s.all())

    # Nothing ever succeeds: no group is mixed, so the rounds run until the budget is spent —
    # exactly spent, never more — and the filter drops every group, whose rollouts still count.
    none = rounds(0.0)
    r = none.result
    assert r.stats.trajectories == spec.total == sum(len(t.outcomes()) for t in r.trees) == int(none.m.sum())
    assert r.rounds == len(r.trees) == spec.total // spec.group_size_G  # one prompt a round here
    assert not any(r.kept) and r.stats.bare_trajectories == spec.total and r.stats.continuations == 0

    # A coin flip: rounds stop once the target of mixed groups is reached (before the budget runs
    # out); one-outcome groups are dropped, mixed ones kept up to the target.
    coin = rounds(0.5)
    r = coin.result
    flags = [mixed(t) for t in r.trees]
    assert sum(len(t.outcomes()) for t in r.trees) == r.stats.trajectories <= spec.total
    assert r.kept == rule.keep_groups(np.array(flags), spec).tolist()
    assert sum(r.kept) == min(sum(flags), rule.target_groups(spec))
    assert all(flags[i] for i, k in enumerate(r.kept) if k)
    if sum(flags) >= rule.target_groups(spec):
        assert flags[-1]  # the last round is the one that reached the target
    assert sorted(t.prompt_id for t in r.trees) == sorted(t.id for t, mi in zip(pool, coin.m, strict=True) if mi)

    class Overspend:  # a rule that asks for more than its cap is stopped before it rolls out
        def next_round(self, v, available, mixed_groups, spent, rounds, spec, rng):
            out = np.zeros(v.shape[0], dtype=np.int64)
            out[available] = spec.total
            return out

        def keep_groups(self, flags, spec):
            return np.asarray(flags, dtype=bool)

        def limits(self, spec):
            return RoundLimits(None, spec.total)

    import dataclasses

    greedy = dataclasses.replace(dapo, group_filter=Overspend())
    executor = TreeRolloutExecutor(engine, tokenizer, fixed_env, AGENT)
    with pytest.raises(AssertionError, match="budget"):
        executor.run_in_rounds(pool, np.full(spec.pool_size, 0.5), greedy, spec, np.random.default_rng(0))
    assert engine.num_pending == 0
    with pytest.raises(ValueError, match="no round rule"):
        executor.run_in_rounds(pool, np.full(spec.pool_size, 0.5), get_method("grpo"), spec, np.random.default_rng(0))


def test_published_rounds_spend_past_the_budget_and_skip_what_the_filter_skips(engine, tokenizer) -> None:
    import dataclasses

    spec = BudgetSpec(roots_M=8, expansion_N=1, group_size_G=4, max_per_prompt=4, pool_factor=2)
    pool = tasks(spec.pool_size, turns=2)

    def never(task: Task) -> FixedTurnsEnvironment:
        return FixedTurnsEnvironment(num_turns=task.metadata["turns"], success_rate=0.0)

    executor = TreeRolloutExecutor(engine, tokenizer, never, AGENT, tool_workers=0)
    # DAPO as published: nothing is ever mixed, so it samples until the candidates run out (a
    # round of 3 × 4 prompts, capped by the pool's 8), spending twice M(1+N), all of it counted
    r = executor.run_in_rounds(pool, np.full(spec.pool_size, 0.5), get_method("dapo"), spec,
                               np.random.default_rng(0)).result
    assert r.stats.trajectories == 8 * 4 == 2 * spec.total and r.rounds == 1 and not any(r.kept)
    # GRESO's filter in front of the rounds: the history says prompts 0..3 were all failures;
    # with no re-admission they are never rolled out
    history = PromptHistory()
    history.record(0, [t.id for t in pool[:4]], [0] * 4, [4] * 4, [0.5] * 4)
    strict = GresoRoots(GresoConfig(initial_p_easy=0.0, initial_p_hard=0.0, p_min=0.0, min_keep_probability=0.0))
    greso = dataclasses.replace(get_method("greso"), root_rule=strict, candidate_filter=strict)
    rounds = executor.run_in_rounds(pool, np.full(spec.pool_size, 0.5), greso, spec, np.random.default_rng(0),
                                    history=history.view([t.id for t in pool], 1))
    assert rounds.m[:4].sum() == 0 and (rounds.m[4:] == 4).all()
    assert rounds.result.stats.trajectories == 16 == int(rounds.m.sum())


def test_anchor_predictions_come_back_per_tree_and_nan_where_not_scored(engine, tokenizer) -> None:
    scored: dict[str, dict[int, float]] = {}

    def scorer(tree, nodes) -> np.ndarray:
        p = np.linspace(0.1, 0.9, len(nodes))
        scored[tree.prompt_id] = dict(zip((int(n) for n in nodes), p.tolist(), strict=True))
        return p

    executor = TreeRolloutExecutor(engine, tokenizer, fixed_env, AGENT, tool_workers=0)
    result = executor.run(tasks(2), [2, 3], expansion_of(get_method("trace"), 2, scorer), np.random.default_rng(0))
    assert len(result.anchor_predictions) == len(result.trees)
    for tree, pred in zip(result.trees, result.anchor_predictions, strict=True):
        assert set(scored[tree.prompt_id]) == set(tree.anchors())
        want = np.full(len(tree.nodes), np.nan)
        for node, value in scored[tree.prompt_id].items():
            want[node] = value
        np.testing.assert_array_equal(pred, want)
        assert all("predicted_value" not in n.info for n in tree.nodes)  # the logged trees carry no predictions
    bare = run(engine, tokenizer, "grpo", [2], 0, tasks(1))
    assert bare.anchor_predictions[0].shape == (len(bare.trees[0].nodes),)
    assert np.isnan(bare.anchor_predictions[0]).all()


def test_a_token_priced_prompt_spends_its_allowance_by_the_methods_stage_2(engine, tokenizer) -> None:
    """trace-tokens (method §10): once a prompt's bare rollouts finish, its allowance is its
    reservation plus its roots' expected tokens less their realised ones, and the continuations
    and further roots the executor starts are exactly what the method's stage 2 buys with it."""
    from trace_core.costs import CostModel, remaining_tokens
    from trace_core.rollout.executor import TokenAllowance
    from trace_core.token_budget import spend_prompt_tokens
    from trace_core.token_ledger import TokenLedger

    method = get_method("trace-tokens")
    ledger = TokenLedger(CostModel(initial_tokens=36.0, initial_turns=3.0))
    reserved, root_cost, root_p = np.array([150.0, 0.0, 60.0]), np.array([36.0, 30.0, 36.0]), np.array([0.5, 0.3, 0.6])
    m = [2, 3, 0]
    executor = TreeRolloutExecutor(engine, tokenizer, fixed_env, AGENT, tool_workers=0)
    result = executor.run(tasks(3, turns=3), m, expansion_of(method, 0, random_scorer,
                                                              TokenAllowance(reserved, root_cost, root_p, ledger)),
                          np.random.default_rng(0))
    expands = {e.prompt_id: e.detail for e in result.events if e.kind == "expand"}
    assert sorted(expands) == ["q0", "q1"]  # q2 had no roots
    spent_any = False
    for i, tree in enumerate(result.trees):
        bare = tree.bare_trajectories()
        realised = sum(sum(tree.nodes[n].loss_mask) for b in bare for n in b.nodes)
        allowance = reserved[i] + root_cost[i] * m[i] - realised
        detail = expands[tree.prompt_id]
        assert detail["allowance"] == pytest.approx(allowance)
        anchors = tree.anchors()
        turn = np.array([tree.nodes[a].depth for a in anchors])
        cost = remaining_tokens(ledger.costs, ledger.cost_model, np.full(len(anchors), root_cost[i]), turn,
                                np.array([tree.bare_length(a) for a in anchors], dtype=np.float64))
        r = np.array([tree.trajectory_reward(tree.nodes[a].trajectory) for a in anchors])
        outcomes = np.array([tree.trajectory_reward(b.id) for b in bare])
        want = spend_prompt_tokens(result.anchor_predictions[i][anchors], r, turn, cost, outcomes, root_p[i],
                                   root_cost[i], allowance)
        got = result.continuations_per_anchor[tree.prompt_id]
        expected = {int(a): int(k) for a, k in zip(anchors, want.K, strict=True) if k > 0}
        if want.extra_roots:
            expected[ROOT] = want.extra_roots
        assert got == expected
        assert detail["expected_tokens"] == pytest.approx(want.tokens) and want.tokens <= max(allowance, 0.0) + 1e-9
        starts: dict[int, int] = {}
        for t in tree.trajectories:
            if t.kind == "continuation":
                starts[t.branch_node] = starts.get(t.branch_node, 0) + 1
        assert starts == got
        spent_any |= bool(got)
    assert spent_any  # q0's reservation of 150 tokens buys continuations


def test_a_token_allowance_belongs_to_a_token_priced_method_only(engine, tokenizer) -> None:
    from trace_core.costs import CostModel
    from trace_core.rollout.executor import Expansion, TokenAllowance
    from trace_core.token_ledger import TokenLedger

    allowance = TokenAllowance(np.zeros(2), np.full(2, 10.0), np.full(2, 0.5), TokenLedger(CostModel()))
    with pytest.raises(ValueError, match="TokenAllowance"):
        Expansion(get_method("trace-tokens"), 0, random_scorer)
    with pytest.raises(ValueError, match="TokenAllowance"):
        Expansion(get_method("trace"), 2, random_scorer, allowance)
    with pytest.raises(ValueError, match="root_cost must be finite and > 0"):
        TokenAllowance(np.zeros(2), np.zeros(2), np.full(2, 0.5), TokenLedger(CostModel()))
    executor = TreeRolloutExecutor(engine, tokenizer, fixed_env, AGENT, tool_workers=0)
    with pytest.raises(ValueError, match="2 entries for 3 tasks"):
        executor.run(tasks(3), [2, 2, 2], Expansion(get_method("trace-tokens"), 0, random_scorer, allowance),
                     np.random.default_rng(0))
