"""Policy optimisation: tree-packed PPO-clip under DeepSpeed ZeRO, and the trainer's step loop."""
