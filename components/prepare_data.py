"""prepare_data: the DVC data version, checked, validated with Great Expectations; fails on bad data."""

from kfp import dsl
from kfp.dsl import Dataset, Output

from components import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)  # the images ship kfp (the lock)
def prepare_data(
    data_config: str,
    workspace: str,
    reuse: bool,
    tracking_uri: str,
    experiment: str,
    kfp_run_id: str,
    data: Output[Dataset],
) -> str:
    """Produce the validated data directory and return its DVC md5 (the data version).

    ``data_config`` (JSON of ``DataStepConfig``) picks the source: ``regenerate`` rebuilds the
    embedded data and fails unless its md5 equals ``data.dvc``'s; ``dvc-pull`` pulls ``data.dvc``
    from the DVC remote (``DVC_REMOTE_URL``, ``DVC_S3_ENDPOINT_URL`` and the remote's secret in the
    environment); ``path`` takes ``data_dir`` as it is. Every JSONL file then runs through its
    Great Expectations suite: one bad row raises ``DataValidationError`` and fails the run.
    """
    import json

    from pipelines.steps.artifacts import StepContext
    from pipelines.steps.prepare_data import run_prepare_data

    ctx = StepContext(workspace, reuse, tracking_uri, experiment, kfp_run_id)
    prepared = run_prepare_data(json.loads(data_config), ctx, data.path)
    data.metadata.update(prepared.metadata.to_dict())
    return prepared.version
