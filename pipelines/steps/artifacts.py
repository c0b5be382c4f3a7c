"""The typed values a component hands its step: input artifacts and the step's context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ArtifactRef:
    """An input artifact: where its files are and the metadata the step that made it wrote
    (fingerprints, MLflow run ids, the DVC md5 of the data)."""

    path: str  # the artifact's local path (a file or a directory)
    metadata: dict[str, Any] = field(default_factory=dict)  # its producer's metadata

    @classmethod
    def of(cls, artifact: Any) -> ArtifactRef:
        """The reference of a KFP artifact (anything with ``path`` and ``metadata``)."""
        return cls(artifact.path, dict(artifact.metadata))


@dataclass(frozen=True)
class StepContext:
    """Where a step keeps its finished results and where it logs its MLflow run."""

    workspace: str  # root of the reuse cache: ``<workspace>/<stage>/<fingerprint>/``
    reuse: bool  # reuse a finished result whose fingerprint matches (False: always recompute)
    tracking_uri: str  # the MLflow tracking server (or sqlite URI)
    experiment: str  # the MLflow experiment of the pipeline's runs
    kfp_run_id: str = ""  # the Kubeflow Pipelines run, for the lineage tags ("": a step that tags no run)
