"""TRACE inside verl, tested against the real verl 0.9.1 in its own environment (.venv-verl, built
by `make verl-venv`; tests/test_integration_verl.py runs this file there). verl's DataProto, its
estimator registry and its trainer's compute_advantage run as they are; the trees are real
rollouts of the tiny policy (the golden records' first steps)."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (importing verl loads its plug-ins: ours among them)
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.ray_trainer import compute_advantage

from trace_core.advantages import tree_advantages
from trace_core.integrations.rows import trajectory_rows
from trace_core.integrations.verl import (
    TRACE_ESTIMATOR,
    TreeRowId,
    compute_tree_advantage,
    data_proto,
    rollout_n_column,
    tree_advantage_rows,
)
from trace_core.tree import RolloutTree

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
PAD = 0


def golden_trees(method: str) -> list[RolloutTree]:
    record = json.loads(gzip.open(GOLDEN / f"{method}.json.gz").read())
    return [RolloutTree.from_dict(t) for t in record["steps"][0]["trees"]]


def expected_rows(trees: list[RolloutTree], scale_by_std: bool = True) -> list[np.ndarray]:
    """trace_core's own per-token advantages of every trajectory, row by row."""
    rows = trajectory_rows(trees, [tree_advantages(t, scale_by_std=scale_by_std) for t in trees])
    return [r.advantages for r in rows]


def verl_advantages(data: DataProto, estimator: str, norm: bool = True) -> torch.Tensor:
    out = compute_advantage(data, adv_estimator=estimator, norm_adv_by_std_in_grpo=norm,
                            config=AlgoConfig(adv_estimator=estimator, norm_adv_by_std_in_grpo=norm))
    return out.batch["advantages"]


def test_verl_loads_the_plugin_and_its_registry_names_the_tree_advantage() -> None:
    assert get_adv_estimator_fn(TRACE_ESTIMATOR) is compute_tree_advantage


def test_rows_of_a_tree_with_continuations_are_its_trajectories_with_their_exact_histories() -> None:
    trees = golden_trees("trace")
    assert any(t.kind == "continuation" for tree in trees for t in tree.trajectories)
    data = data_proto(trees, PAD)
    assert len(data) == sum(len(t.trajectories) for t in trees)
    i = 0
    for tree in trees:
        for traj in tree.trajectories:
            prompt = data.batch["prompts"][i][data.batch["attention_mask"][i, : data.batch["prompts"].shape[1]] == 1]
            assert prompt.tolist() == tree.history_tokens(traj.branch_node)  # an anchor's history, exactly
            uid = data.non_tensor_batch["uid"][i]
            assert isinstance(uid, TreeRowId) and uid.trajectory == traj.id
            n = int(data.batch["response_mask"][i].shape[0])
            own = [tok for node in traj.nodes for tok in tree.nodes[node].token_ids]
            assert data.batch["responses"][i][: len(own)].tolist() == own
            mask = [m for node in traj.nodes for m in tree.nodes[node].loss_mask]
            assert data.batch["response_mask"][i].tolist() == mask + [0] * (n - len(mask))  # 0 on observations
            assert float(data.batch["token_level_rewards"][i].sum()) == pytest.approx(tree.trajectory_reward(traj.id))
            i += 1


def test_verl_computes_trace_core_s_tree_advantage_per_token() -> None:
    trees = golden_trees("trace")
    data = data_proto(trees, PAD)
    got = verl_advantages(data, TRACE_ESTIMATOR)
    for i, want in enumerate(expected_rows(trees)):
        assert torch.allclose(got[i, : len(want)], torch.tensor(want, dtype=got.dtype), atol=1e-6)
        assert not got[i, len(want):].any()
    assert (got[data.batch["response_mask"] == 0] == 0).all()  # observation tokens carry no advantage
    assert got.abs().sum() > 0  # the step has mixed groups: a comparison that can fail


def test_without_the_std_divisor_it_is_the_no_std_tree_advantage() -> None:
    trees = golden_trees("trace")
    got = verl_advantages(data_proto(trees, PAD), TRACE_ESTIMATOR, norm=False)
    for i, want in enumerate(expected_rows(trees, scale_by_std=False)):
        assert torch.allclose(got[i, : len(want)], torch.tensor(want, dtype=got.dtype), atol=1e-6)


def test_on_trees_without_continuations_it_equals_verl_s_own_grpo() -> None:
    trees = golden_trees("grpo")
    assert all(t.kind == "bare" for tree in trees for t in tree.trajectories)
    ours = verl_advantages(data_proto(trees, PAD), TRACE_ESTIMATOR)
    plain = data_proto(trees, PAD)
    plain.non_tensor_batch["uid"] = np.array([u.key for u in plain.non_tensor_batch["uid"]], dtype=object)
    grpo = verl_advantages(plain, "grpo")
    assert grpo.abs().sum() > 0
    assert torch.allclose(ours, grpo, atol=1e-5)


def test_the_rewards_are_verl_s_not_the_tree_s() -> None:
    """verl's reward manager fills token_level_rewards: the estimator reads those, so a flipped
    reward flips the row's advantage sign."""
    trees = golden_trees("grpo")
    data = data_proto(trees, PAD)
    before = verl_advantages(data, TRACE_ESTIMATOR).clone()
    flipped = data_proto(trees, PAD)
    length = flipped.batch["attention_mask"][:, flipped.batch["prompts"].shape[1]:].sum(dim=1)
    old = flipped.batch["token_level_rewards"].sum(dim=1)
    rewards = torch.zeros_like(flipped.batch["token_level_rewards"])
    rewards[torch.arange(len(length)), length - 1] = 1.0 - old  # r -> 1 - r, at the last response token
    flipped.batch["token_level_rewards"] = rewards
    after = verl_advantages(flipped, TRACE_ESTIMATOR)
    mixed = before.abs().sum(dim=1) > 0
    assert mixed.any()
    assert torch.allclose(after[mixed], -before[mixed], atol=1e-5)


def test_rows_pickled_and_split_as_ray_moves_them_give_the_same_advantages() -> None:
    trees = golden_trees("trace")
    data = data_proto(trees, PAD)
    want = verl_advantages(data_proto(trees, PAD), TRACE_ESTIMATOR)
    moved = DataProto.concat([pickle.loads(pickle.dumps(part)) for part in data.chunk(2)])
    assert torch.allclose(verl_advantages(moved, TRACE_ESTIMATOR), want)


def test_a_tree_missing_a_trajectory_or_rows_without_tree_ids_are_refused_by_name() -> None:
    trees = golden_trees("trace")
    data = data_proto(trees, PAD)
    rewards = data.batch["token_level_rewards"].sum(-1).numpy()
    mask = data.batch["response_mask"].numpy()
    uids = data.non_tensor_batch["uid"]
    with pytest.raises(ValueError, match=rf"tree '{trees[0].prompt_id}': trajectories \[0\] have no row"):
        tree_advantage_rows(rewards[1:], mask[1:], uids[1:])
    with pytest.raises(ValueError, match="row 0's uid is str .* not a TreeRowId"):
        tree_advantage_rows(rewards, mask, np.array([str(u) for u in uids], dtype=object))
    with pytest.raises(ValueError, match="is in the batch twice"):
        tree_advantage_rows(np.r_[rewards, rewards[:1]], np.r_[mask, mask[:1]], np.r_[uids, uids[:1]])
    shifted = mask.copy()
    shifted[0] = np.roll(shifted[0], 1)
    with pytest.raises(ValueError, match="row 0 .* its response mask is not its trajectory's tool mask"):
        tree_advantage_rows(rewards, shifted, uids)


def test_the_root_plan_becomes_verl_s_rollout_n_column() -> None:
    column = rollout_n_column(np.array([3, 1, 4], dtype=np.int64))
    assert column.dtype == object and column.tolist() == [3, 1, 4]
    with pytest.raises(ValueError, match=r"drop the m_i = 0 prompts"):
        rollout_n_column(np.array([2, 0], dtype=np.int64))


def test_the_integration_guide_s_verl_snippets_run_as_written() -> None:
    import re

    doc = Path(__file__).resolve().parents[2] / "docs" / "integration.md"
    snippets = re.findall(r"```python verl\n(.*?)```", doc.read_text(), flags=re.S)
    assert snippets, "docs/integration.md holds no verl snippet"
    namespace: dict = {}
    for n, code in enumerate(snippets):
        exec(compile(code, f"docs/integration.md verl snippet {n + 1}", "exec"), namespace)
