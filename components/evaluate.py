"""evaluate: a trained policy on held-out benchmarks; the metrics go to its training run."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from components import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)  # the images ship kfp (the lock)
def evaluate(
    trained: Input[Model],
    data: Input[Dataset],
    index: Input[Artifact],
    eval_config: str,
    train_config: str,
    workspace: str,
    reuse: bool,
    tracking_uri: str,
    experiment: str,
    result: Output[Artifact],
    metrics: Output[Metrics],
) -> float:
    """Evaluate ``trained/policy`` with ``trace_core.evaluation`` and return its score: the train
    family's average of the primary metric (pass@1 averaged over k samples).

    The evaluation runs with the training run's agent limits and environment settings, and logs
    ``eval/...`` metrics and files into the *training* MLflow run, so that one run holds how the
    policy was trained and how well it does."""
    import json
    import math

    from pipelines.steps.artifacts import ArtifactRef, StepContext
    from pipelines.steps.evaluate import run_evaluate

    ctx = StepContext(workspace, reuse, tracking_uri, experiment)
    made = run_evaluate(ArtifactRef.of(trained), ArtifactRef.of(data), ArtifactRef.of(index),
                        json.loads(eval_config), json.loads(train_config), ctx, result.path)
    result.metadata.update(made.metadata.to_dict())
    if math.isfinite(made.score):
        metrics.log_metric(f"{made.family}_{made.primary_metric}", made.score)
    return made.score
