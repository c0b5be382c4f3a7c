"""One PolicyOptimizer update on fixed synthetic trees per ZeRO stage; rank 0 writes each
stage's parameter update to OUT_PREFIX<stage>.npz.

    python tests/workers/zero_update.py MODEL_DIR 2,3 OUT_PREFIX          (one process)
    torchrun --nproc_per_node=2 tests/workers/zero_update.py MODEL_DIR 2,3 OUT_PREFIX
"""

from __future__ import annotations

import os
import sys

import numpy as np

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def synthetic_trees(vocab: int, seed: int = 0):
    from trace_core.advantages import get_advantage_estimator
    from trace_core.tree import RolloutTree

    rng = np.random.default_rng(seed)
    trees = []
    for p in range(5):
        tree = RolloutTree(f"p{p}", rng.integers(3, vocab, size=12).tolist())
        anchors = []
        for _ in range(3):
            t = tree.start_trajectory("bare")
            for _turn in range(3):
                n_model, n_obs = int(rng.integers(2, 6)), int(rng.integers(1, 4))
                node = tree.add_turn(t, rng.integers(3, vocab, size=n_model + n_obs).tolist(),
                                     [1] * n_model + [0] * n_obs,
                                     logprobs=(-rng.random(n_model + n_obs)).tolist())
                anchors.append(node)
            tree.finish(t, float(rng.integers(0, 2)))
        c = tree.start_trajectory("continuation", branch_node=anchors[0])
        tree.add_turn(c, rng.integers(3, vocab, size=4).tolist(), [1, 1, 1, 1], logprobs=[-1.0] * 4)
        tree.finish(c, 1.0 - tree.trajectory_reward(0))
        trees.append(tree)
    return trees, get_advantage_estimator("tree")(trees)


def main() -> None:
    import torch

    from trace_core.training.policy import PolicyOptimizer, PolicyTrainConfig

    model_dir, stages, out = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3]
    for stage in stages:
        cfg = PolicyTrainConfig(lr=1e-3, zero_stage=stage, micro_batches=2, grad_clip=0.0)
        opt = PolicyOptimizer(model_dir, cfg)
        before = opt.full_state_dict()
        trees, adv = synthetic_trees(int(opt.engine.module.config.vocab_size))
        stats = opt.update(trees, adv)
        after = opt.full_state_dict()
        if opt.rank == 0:
            delta = {k: (after[k] - before[k]).double().numpy() for k in before}
            np.savez(f"{out}{stage}.npz", **delta)
            print("stage", stage, "world", opt.world_size, "stats", stats, flush=True)
        torch.distributed.barrier()
        opt.engine.destroy()
        del opt


if __name__ == "__main__":
    main()
