"""build_retriever_index: the faiss index over the QA corpus that the search tool queries."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Output

from components import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)  # the images ship kfp (the lock)
def build_retriever_index(
    data: Input[Dataset],
    index_config: str,
    workspace: str,
    reuse: bool,
    tracking_uri: str,
    experiment: str,
    kfp_run_id: str,
    index: Output[Artifact],
):
    """Embed ``qa/corpus.jsonl`` of the validated data and write the index artifact
    (``trace_core.retrieval``: index.faiss, passages.jsonl, manifest.json)."""
    import json

    from pipelines.steps.artifacts import ArtifactRef, StepContext
    from pipelines.steps.build_retriever_index import run_build_retriever_index

    ctx = StepContext(workspace, reuse, tracking_uri, experiment, kfp_run_id)
    built = run_build_retriever_index(ArtifactRef.of(data), json.loads(index_config), ctx, index.path)
    index.metadata.update(built.metadata.to_dict())
