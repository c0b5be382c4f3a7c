"""The MLflow Model Registry for policies: register every retrained policy, promote only a better one.

A recurring retrain registers its policy as a new version of one registered model and moves the
``champion`` alias to it only when its evaluation score beats the champion's (strictly; ties keep
the champion). The score and the decision are version tags, so the registry alone says why a
version is or is not the champion:

    score.<metric>         the version's evaluation score (e.g. ``score.eval/success_rate``)
    promoted               "true" / "false"
    champion_score         the champion's score when the decision was made ("none" if there was none)
    fingerprint            the pipeline step's fingerprint (registering the same result twice is a no-op)

The policy files are logged as artifacts of the training run (``policy/``), and the version's
source is that artifact directory, so :func:`download_policy` works with any artifact store.
This module and :mod:`trace_core.tracking` are the only places that talk to MLflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHAMPION = "champion"
POLICY_ARTIFACT = "policy"


@dataclass(frozen=True)
class RegistryDecision:
    """What registering one policy did."""

    model_name: str
    version: str
    run_id: str
    score: float
    champion_score: float | None  # the champion's score before this version (None: there was none)
    promoted: bool
    reused: bool = False  # this exact result was registered before; nothing new was created

    def summary(self) -> str:
        before = "no champion" if self.champion_score is None else f"champion {self.champion_score:.4f}"
        verdict = f"promoted to @{CHAMPION}" if self.promoted else "registered, not promoted"
        return f"{self.model_name} v{self.version}: score {self.score:.4f} vs {before} -> {verdict}"


def _client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def _score_tag(metric: str) -> str:
    return f"score.{metric}"


def champion(tracking_uri: str, model_name: str) -> Any | None:
    """The champion ModelVersion of ``model_name``, or None (no model or no champion yet)."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    try:
        return client.get_model_version_by_alias(model_name, CHAMPION)
    except MlflowException:
        return None


def latest_version(tracking_uri: str, model_name: str) -> Any | None:
    """The most recently registered version of ``model_name``, or None."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    try:
        versions = client.search_model_versions(f"name = '{model_name}'")
    except MlflowException:
        return None
    return max(versions, key=lambda v: int(v.version)) if versions else None


def starting_point(tracking_uri: str, model_name: str) -> Any | None:
    """Where a recurring retrain starts: the champion, else the latest version, else None."""
    return champion(tracking_uri, model_name) or latest_version(tracking_uri, model_name)


def register_policy(
    tracking_uri: str,
    model_name: str,
    run_id: str,
    policy_dir: str | Path,
    score: float,
    metric: str,
    fingerprint: str,
    tags: dict[str, str] | None = None,
) -> RegistryDecision:
    """Log ``policy_dir`` to run ``run_id``, register it as a new version of ``model_name`` and
    promote it to champion when ``score`` beats the champion's (module docstring)."""
    from mlflow.exceptions import MlflowException

    if not math.isfinite(score):
        raise ValueError(f"score must be finite to compare with the champion, got {score}")
    policy_dir = Path(policy_dir)
    if not (policy_dir / "config.json").is_file():
        raise ValueError(f"policy_dir {policy_dir} is not a saved model (no config.json)")
    client = _client(tracking_uri)
    try:
        client.get_registered_model(model_name)
    except MlflowException:
        client.create_registered_model(model_name, description="trace-rl policies from the pipeline's retrains")
    for mv in client.search_model_versions(f"name = '{model_name}'"):
        if mv.tags.get("fingerprint") == fingerprint:  # the same step result, registered before
            prev = mv.tags.get("champion_score", "none")
            return RegistryDecision(model_name, mv.version, mv.run_id, float(mv.tags[_score_tag(metric)]),
                                    None if prev == "none" else float(prev), mv.tags.get("promoted") == "true",
                                    reused=True)
    current = champion(tracking_uri, model_name)
    champion_score = None
    if current is not None and _score_tag(metric) in current.tags:
        champion_score = float(current.tags[_score_tag(metric)])
    client.log_artifacts(run_id, str(policy_dir), POLICY_ARTIFACT)
    source = client.get_run(run_id).info.artifact_uri.rstrip("/") + "/" + POLICY_ARTIFACT
    promoted = current is None or champion_score is None or score > champion_score
    version_tags = {
        **(tags or {}),
        _score_tag(metric): repr(float(score)),
        "champion_score": "none" if champion_score is None else repr(champion_score),
        "promoted": str(promoted).lower(),
        "fingerprint": fingerprint,
    }
    mv = client.create_model_version(model_name, source=source, run_id=run_id, tags=version_tags)
    if promoted:
        client.set_registered_model_alias(model_name, CHAMPION, mv.version)
    return RegistryDecision(model_name, mv.version, run_id, float(score), champion_score, promoted)


def download_policy(tracking_uri: str, version: Any, dst: str | Path) -> Path:
    """Download a ModelVersion's policy directory to ``dst`` (replaced); returns the directory."""
    import shutil

    import mlflow.artifacts

    dst = Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".download")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source, dst_path=str(tmp),
                                                     tracking_uri=tracking_uri))
    if not (local / "config.json").is_file():
        raise ValueError(f"model version {version.name} v{version.version} holds no policy at {version.source}")
    local.rename(dst)
    shutil.rmtree(tmp, ignore_errors=True)
    return dst
