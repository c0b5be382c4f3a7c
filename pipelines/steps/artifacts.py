"""The typed values a component hands its step: input artifacts and the step's context."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class ArtifactMetadata:
    """What a step records on an artifact it made, read back by the steps after it. Each step
    fills the fields that apply to it; the rest keep their empty defaults. On a KFP artifact (and
    in a DVC stage's ``.meta.json``) it travels as the dict of :meth:`to_dict`."""

    fingerprint: str = ""  # the result's reuse key (every step); the next step's fingerprint includes it
    dvc_md5: str = ""  # the DVC md5 of the data the artifact was made from
    run_id: str = ""  # the MLflow run that made it (train, evaluate, profile: the training run)
    method: str = ""  # the allocation method it was trained with (train, evaluate, profile)
    source: str = ""  # prepare_data: where the data came from (regenerate, dvc-pull, path)
    files: int = 0  # prepare_data: data files its Great Expectations suites validated
    passages: int = 0  # build_retriever_index: passages in the index
    origin: str = ""  # warm_start: "sft" or "registry:<model>/<version>"
    score: float | None = None  # evaluate: the train family's average of the primary metric
    primary_metric: str = ""  # evaluate: the metric the score averages (pass@1 over k samples)
    training_runs: dict[str, str] = field(default_factory=dict)  # compare: method -> its training run

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set (an empty field is left out)."""
        empty = ArtifactMetadata()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(empty, f.name)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "artifact metadata") -> ArtifactMetadata:
        """Read back what :meth:`to_dict` wrote; a key that is no field is refused, naming it."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{where}: keys {unknown} are not fields of ArtifactMetadata ({', '.join(sorted(known))})")
        return cls(**dict(raw))


@dataclass(frozen=True)
class ArtifactRef:
    """An input artifact: where its files are and the metadata the step that made it recorded."""

    path: str  # the artifact's local path (a file or a directory)
    metadata: ArtifactMetadata = field(default_factory=ArtifactMetadata)  # its producer's metadata

    @classmethod
    def of(cls, artifact: Any) -> ArtifactRef:
        """The reference of a KFP artifact (anything with ``path`` and ``metadata``)."""
        return cls(artifact.path, ArtifactMetadata.from_dict(artifact.metadata, f"artifact {artifact.path}"))


@dataclass(frozen=True)
class StepContext:
    """Where a step keeps its finished results and where it logs its MLflow run."""

    workspace: str  # root of the reuse cache: ``<workspace>/<stage>/<fingerprint>/``
    reuse: bool  # reuse a finished result whose fingerprint matches (False: always recompute)
    tracking_uri: str  # the MLflow tracking server (or sqlite URI)
    experiment: str  # the MLflow experiment of the pipeline's runs
    kfp_run_id: str = ""  # the Kubeflow Pipelines run, for the lineage tags ("": a step that tags no run)
