"""Warm start: turn a random tiny Qwen3 into a policy that solves some but not
all embedded tasks, so that RL has mixed rewards to learn from.

    experts.py   scripted math / QA experts writing the agent's turns, with a controllable error rate
    tools.py     cheap stand-ins of the tools for demonstrations (trusted in-process Python, lexical search)
    demos.py     scripts rendered to token ids exactly as the rollout executor stores a trajectory
    policy.py    the tokenizer corpus (digits split) and the tiny model shape; builds via trace_core.models
    sft.py       supervised fine-tuning on the model-written tokens (shared-prefix batching)
    evaluate.py  success rate through HFEngine + TreeRolloutExecutor + the real environments
    pipeline.py  all of it end to end; CLI: ``python -m trace_core.warmstart --help``
"""

from trace_core.warmstart.demos import Demo, DemoConfig, build_demos, build_scripts, render_demo, render_demos
from trace_core.warmstart.experts import ExpertStep, MathExpert, QAExpert, Script
from trace_core.warmstart.sft import SFTConfig, sft

__all__ = [
    "Demo",
    "DemoConfig",
    "ExpertStep",
    "MathExpert",
    "QAExpert",
    "SFTConfig",
    "Script",
    "build_demos",
    "build_scripts",
    "render_demo",
    "render_demos",
    "sft",
]
