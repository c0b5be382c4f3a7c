"""train: RL training of the warm-started policy with one method of the registry (grpo, pcl, treepo, trace, ...)."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)  # the images ship kfp (the lock)
def train(
    method: str,
    data: Input[Dataset],
    index: Input[Artifact],
    warm_policy: Input[Model],
    testbed: Input[Dataset],
    train_config: str,
    gpus: int,
    nodes: int,
    platform_config: str,
    workspace: str,
    reuse: bool,
    tracking_uri: str,
    experiment: str,
    kfp_run_id: str,
    trained: Output[Model],
) -> str:
    """Train with ``method`` and return the MLflow run id.

    ``train_config`` is the trainer's TrainConfig (JSON), the single config source; the step sets
    the method, the inputs' paths and the tracking target. Where it runs: in this process on CPU
    or one GPU; with ``gpus > 1`` DeepSpeed over ``torchrun`` in this pod; with ``nodes > 1`` a
    Training Operator PyTorchJob (``pipelines/pytorchjob.py``) that this step launches and
    follows. ``{testbed}`` in the config's file paths (the RL pool, the predictor's warm-up split)
    is the warm-start step's testbed folder. The output holds ``policy/``, ``summary.json`` (final
    metrics, cost fractions, pool success, warm-up), ``history.json`` (every step's metrics),
    ``allocations/`` (each step's root allocation) and ``cost_breakdown.txt``; the MLflow run
    carries the lineage tags."""
    import json

    from pipelines.steps.artifacts import ArtifactRef, StepContext
    from pipelines.steps.train import Placement, run_train

    ctx = StepContext(workspace, reuse, tracking_uri, experiment, kfp_run_id)
    made = run_train(method, ArtifactRef.of(data), ArtifactRef.of(index), ArtifactRef.of(warm_policy),
                     ArtifactRef.of(testbed), json.loads(train_config),
                     Placement(gpus, nodes, json.loads(platform_config)), ctx, trained.path)
    trained.metadata.update(made.metadata.to_dict())
    return made.run_id
