"""build_retriever_index: the faiss index over the QA corpus that the search tool queries."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.lineage import StageCache, closure_digest, copy_tree, fingerprint, lineage_tags
from pipelines.steps.artifacts import ArtifactMetadata, ArtifactRef, StepContext

STAGE = "build_retriever_index"


@dataclass(frozen=True)
class BuiltIndex:
    """What build_retriever_index made: the index artifact's metadata."""

    metadata: ArtifactMetadata  # fingerprint, passages, run_id, dvc_md5


def run_build_retriever_index(data: ArtifactRef, cfg: dict[str, Any], ctx: StepContext, out: str) -> BuiltIndex:
    """Embed ``qa/corpus.jsonl`` of ``data`` and write the index to ``out`` (``cfg``: the
    ``index`` section; files of ``trace_core.retrieval``: index.faiss, passages.jsonl, manifest.json)."""
    from trace_core.retrieval import RetrieverConfig, build_index, corpus_sha256, load_corpus
    from trace_core.tracking import MLflowTracker, TrackingConfig

    config = RetrieverConfig(encoder=cfg["encoder"], index_type=cfg["index_type"], batch_size=cfg["batch_size"])
    passages = load_corpus(Path(data.path) / "qa" / "corpus.jsonl")  # validated again: the suite is cheap
    fp = fingerprint(STAGE, corpus_sha256(passages), cfg, closure_digest(__name__))
    cache = StageCache(ctx.workspace, enabled=ctx.reuse)
    record = cache.lookup(STAGE, fp)
    if record is None:
        work = cache.start(STAGE, fp)
        report = build_index(passages, work / "index", config, progress=False)
        print(report.summary())
        tracker = MLflowTracker(
            TrackingConfig(tracking_uri=ctx.tracking_uri, experiment=ctx.experiment, run_name=STAGE,
                           spool_dir=str(work / "spool")),
            tags={"pipeline.step": STAGE,
                  **lineage_tags(dvc_data_hash=data.metadata.dvc_md5, kfp_run_id=ctx.kfp_run_id,
                                 config=cfg)})
        tracker.log_params(cfg)
        tracker.log_metrics({"passages": float(report.num_passages), "dim": float(report.dim),
                             "embed_seconds": report.embed_seconds,
                             "passages_per_second": report.passages_per_second}, step=0)
        tracker.close()
        record = cache.commit(STAGE, fp, {"passages": report.num_passages, "run_id": tracker.run_id})
    copy_tree(cache.entry(STAGE, fp) / "index", out)
    return BuiltIndex(ArtifactMetadata(fingerprint=fp, passages=record["passages"], run_id=record["run_id"],
                                       dvc_md5=data.metadata.dvc_md5))
