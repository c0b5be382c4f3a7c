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
    import os
    import shutil
    import subprocess
    from pathlib import Path

    from trace_core.data.generate import MANIFEST, dvc_dir_md5, dvc_recorded_md5, validate_dir, verify
    from trace_core.lineage import StageCache, code_digest, copy_tree, fingerprint, lineage_tags
    from trace_core.tracking import MLflowTracker, TrackingConfig

    cfg = json.loads(data_config)
    source, data_dir, dvc_file = cfg["source"], Path(cfg["data_dir"]), Path(cfg["dvc_file"])
    if source not in ("regenerate", "dvc-pull", "path"):
        raise ValueError(f"data.source {source!r} must be regenerate, dvc-pull or path")
    suites_digest = code_digest("trace_core.data.validation")  # the Great Expectations suites
    if source == "path":
        if not data_dir.is_dir():
            raise ValueError(f"data.data_dir {data_dir} is not a directory")
        version = dvc_dir_md5(data_dir)
    else:
        version = dvc_recorded_md5(dvc_file)
    fp = fingerprint("prepare_data", version, source, suites_digest)
    cache = StageCache(workspace, enabled=reuse)
    record = cache.lookup("prepare_data", fp)
    if record is None:
        work = cache.start("prepare_data", fp)
        out = work / "data"
        if source == "regenerate":
            result = verify(out, dvc_file)
            if not result.ok:
                raise ValueError(f"regenerated data has md5 {result.actual}, but {dvc_file} records "
                                 f"{result.expected}: the generators or their config changed")
        elif source == "dvc-pull":
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
        else:
            copy_tree(data_dir, out)
        kinds = validate_dir(out)  # Great Expectations: raises DataValidationError on a bad row
        manifest = json.loads((out / MANIFEST).read_text()) if (out / MANIFEST).is_file() else {}
        tracker = MLflowTracker(TrackingConfig(tracking_uri=tracking_uri, experiment=experiment,
                                               run_name="prepare_data", spool_dir=str(work / "spool")),
                                tags={"pipeline.step": "prepare_data",
                                      **lineage_tags(dvc_data_hash=version, kfp_run_id=kfp_run_id, config=cfg)})
        tracker.log_params({"source": source, "dvc_md5": version, "files": len(kinds)})
        tracker.log_metrics({f"rows/{k}": float(v) for k, v in manifest.get("counts", {}).items()}, step=0)
        tracker.log_dict({"validated": kinds, "manifest": manifest}, "data_report.json")
        tracker.close()
        record = cache.commit("prepare_data", fp, {"dvc_md5": version, "validated": kinds,
                                                   "run_id": tracker.run_id, "source": source})
    copy_tree(cache.entry("prepare_data", fp) / "data", data.path)
    data.metadata.update({"fingerprint": fp, "dvc_md5": version, "source": source, "run_id": record["run_id"],
                          "files": len(record["validated"])})
    return version
