"""warm_start: the policy every method starts from — the registry's champion, or a fresh SFT warm start."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)  # the images ship kfp (the lock)
def warm_start(
    data: Input[Dataset],
    index: Input[Artifact],
    warm_start_config: str,
    agent_config: str,
    registry_config: str,
    workspace: str,
    reuse: bool,
    tracking_uri: str,
    experiment: str,
    kfp_run_id: str,
    policy: Output[Model],
    testbed: Output[Dataset],
) -> str:
    """Write the starting policy (a transformers model directory) and return where it came from.

    With ``from_registry`` (recurring retrains) the policy is the registered champion of
    ``registry.model_name`` (else its latest version); without one, or when nothing is registered
    yet, it is ``trace_core.warmstart``'s SFT on scripted expert demonstrations. With ``testbed``
    the SFT follows the embedded testbed's plan and ``testbed`` receives its question files
    (``pool.jsonl``, ``warmup.jsonl``) and ``testbed.json``."""
    import json

    from pipelines.steps.artifacts import ArtifactRef, StepContext
    from pipelines.steps.warm_start import run_warm_start

    ctx = StepContext(workspace, reuse, tracking_uri, experiment, kfp_run_id)
    made = run_warm_start(ArtifactRef.of(data), ArtifactRef.of(index), json.loads(warm_start_config),
                          json.loads(agent_config), json.loads(registry_config), ctx, policy.path, testbed.path)
    testbed.metadata.update(made.testbed_metadata.to_dict())
    policy.metadata.update(made.policy_metadata.to_dict())
    return made.origin
