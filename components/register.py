"""register: the new policy into the MLflow Model Registry; promoted only if it beats the champion."""

from kfp import dsl
from kfp.dsl import Artifact, Input, Model

from components import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)  # the images ship kfp (the lock)
def register(
    trained: Input[Model],
    evaluation: Input[Artifact],
    registry_config: str,
    tracking_uri: str,
    kfp_run_id: str,
) -> str:
    """Register ``trained/policy`` as a new version of ``registry.model_name`` and move the
    ``champion`` alias to it only when its evaluation score beats the champion's
    (``pipelines.registry``). Registering the same result again changes nothing.
    Returns the decision as JSON."""
    import dataclasses
    import json
    from pathlib import Path

    from pipelines.registry import register_policy
    from pipelines.steps.artifacts import ArtifactRef

    reg = json.loads(registry_config)
    made, evaluated = ArtifactRef.of(trained).metadata, ArtifactRef.of(evaluation).metadata
    decision = register_policy(
        tracking_uri, reg["model_name"], made.run_id, Path(trained.path) / "policy",
        score=float(evaluated.score), metric=reg["metric"], fingerprint=evaluated.fingerprint,
        tags={"method": made.method, "lineage.kfp_run_id": kfp_run_id, "lineage.dvc_data_hash": made.dvc_md5})
    print(decision.summary())
    return json.dumps(dataclasses.asdict(decision))
