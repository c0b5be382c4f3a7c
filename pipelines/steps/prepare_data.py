"""prepare_data: the DVC data version, checked, validated with Great Expectations; fails on bad data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.lineage import StageCache, code_digest, copy_tree, fingerprint, lineage_tags
from pipelines.steps.artifacts import ArtifactMetadata, StepContext

STAGE = "prepare_data"
SOURCES = ("regenerate", "dvc-pull", "path")


@dataclass(frozen=True)
class PreparedData:
    """What prepare_data made: the data version and the data artifact's metadata."""

    version: str  # the DVC md5 of the validated data directory
    metadata: ArtifactMetadata  # fingerprint, dvc_md5, source, run_id, files


def run_prepare_data(cfg: dict[str, Any], ctx: StepContext, out: str) -> PreparedData:
    """Write the validated data directory to ``out`` (``cfg``: the ``data`` section; the
    component's docstring says what each source does). Raises ``DataValidationError`` on a bad
    row and ValueError when the data is not the version ``data.dvc`` records."""
    from trace_core.data.generate import dvc_dir_md5, dvc_recorded_md5

    source, data_dir, dvc_file = cfg["source"], Path(cfg["data_dir"]), Path(cfg["dvc_file"])
    if source not in SOURCES:
        raise ValueError(f"data.source {source!r} must be regenerate, dvc-pull or path")
    suites_digest = code_digest("trace_core.data.validation")  # the Great Expectations suites
    if source == "path":
        if not data_dir.is_dir():
            raise ValueError(f"data.data_dir {data_dir} is not a directory")
        version = dvc_dir_md5(data_dir)
    else:
        version = dvc_recorded_md5(dvc_file)
    fp = fingerprint(STAGE, version, source, suites_digest)
    cache = StageCache(ctx.workspace, enabled=ctx.reuse)
    record = cache.lookup(STAGE, fp)
    if record is None:
        record = _prepare(cfg, ctx, cache, fp, version)
    copy_tree(cache.entry(STAGE, fp) / "data", out)
    return PreparedData(version, ArtifactMetadata(fingerprint=fp, dvc_md5=version, source=source,
                                                  run_id=record["run_id"], files=len(record["validated"])))


def _prepare(cfg: dict[str, Any], ctx: StepContext, cache: StageCache, fp: str, version: str) -> dict[str, Any]:
    """Fetch, validate and log the data into a new cache entry; returns its record."""
    from trace_core.data.generate import MANIFEST, validate_dir, verify
    from trace_core.tracking import MLflowTracker, TrackingConfig

    source, data_dir, dvc_file = cfg["source"], Path(cfg["data_dir"]), Path(cfg["dvc_file"])
    work = cache.start(STAGE, fp)
    out = work / "data"
    if source == "regenerate":
        result = verify(out, dvc_file)
        if not result.ok:
            raise ValueError(f"regenerated data has md5 {result.actual}, but {dvc_file} records "
                             f"{result.expected}: the generators or their config changed")
    elif source == "dvc-pull":
        _dvc_pull(dvc_file, work, out)
    else:
        copy_tree(data_dir, out)
    kinds = validate_dir(out)  # Great Expectations: raises DataValidationError on a bad row
    manifest = json.loads((out / MANIFEST).read_text()) if (out / MANIFEST).is_file() else {}
    tracker = MLflowTracker(TrackingConfig(tracking_uri=ctx.tracking_uri, experiment=ctx.experiment,
                                           run_name=STAGE, spool_dir=str(work / "spool")),
                            tags={"pipeline.step": STAGE,
                                  **lineage_tags(dvc_data_hash=version, kfp_run_id=ctx.kfp_run_id, config=cfg)})
    tracker.log_params({"source": source, "dvc_md5": version, "files": len(kinds)})
    tracker.log_metrics({f"rows/{k}": float(v) for k, v in manifest.get("counts", {}).items()}, step=0)
    tracker.log_dict({"validated": kinds, "manifest": manifest}, "data_report.json")
    tracker.close()
    return cache.commit(STAGE, fp, {"dvc_md5": version, "validated": kinds, "run_id": tracker.run_id,
                                    "source": source})


def _dvc_pull(dvc_file: Path, work: Path, out: Path) -> None:
    """``dvc pull`` of ``dvc_file`` from ``DVC_REMOTE_URL`` in a scratch DVC project, to ``out``."""
    remote = os.environ.get("DVC_REMOTE_URL")
    if not remote:
        raise ValueError("data.source=dvc-pull needs DVC_REMOTE_URL (and the remote's credentials)")
    project = work / "dvc-project"
    project.mkdir()
    shutil.copy2(dvc_file, project / "data.dvc")
    commands = [["dvc", "init", "--no-scm", "-q"], ["dvc", "remote", "add", "-d", "origin", remote]]
    if os.environ.get("DVC_S3_ENDPOINT_URL"):
        commands.append(["dvc", "remote", "modify", "origin", "endpointurl", os.environ["DVC_S3_ENDPOINT_URL"]])
    commands.append(["dvc", "pull", "data.dvc"])
    for command in commands:
        subprocess.run(command, cwd=project, check=True)
    (project / "data").rename(out)
    shutil.rmtree(project)
