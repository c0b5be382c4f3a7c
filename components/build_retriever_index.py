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
    from pathlib import Path

    from trace_core.lineage import StageCache, code_digest, copy_tree, fingerprint, lineage_tags
    from trace_core.retrieval import RetrieverConfig, build_index, corpus_sha256, load_corpus
    from trace_core.tracking import MLflowTracker, TrackingConfig

    cfg = json.loads(index_config)
    config = RetrieverConfig(encoder=cfg["encoder"], index_type=cfg["index_type"], batch_size=cfg["batch_size"])
    passages = load_corpus(Path(data.path) / "qa" / "corpus.jsonl")  # validated again: the suite is cheap
    fp = fingerprint("build_retriever_index", corpus_sha256(passages), cfg, code_digest("trace_core.retrieval"))
    cache = StageCache(workspace, enabled=reuse)
    record = cache.lookup("build_retriever_index", fp)
    if record is None:
        work = cache.start("build_retriever_index", fp)
        report = build_index(passages, work / "index", config, progress=False)
        print(report.summary())
        tracker = MLflowTracker(
            TrackingConfig(tracking_uri=tracking_uri, experiment=experiment, run_name="build_retriever_index",
                           spool_dir=str(work / "spool")),
            tags={"pipeline.step": "build_retriever_index",
                  **lineage_tags(dvc_data_hash=data.metadata.get("dvc_md5", ""), kfp_run_id=kfp_run_id,
                                 config=cfg)})
        tracker.log_params(cfg)
        tracker.log_metrics({"passages": float(report.num_passages), "dim": float(report.dim),
                             "embed_seconds": report.embed_seconds,
                             "passages_per_second": report.passages_per_second}, step=0)
        tracker.close()
        record = cache.commit("build_retriever_index", fp, {"passages": report.num_passages, "run_id": tracker.run_id})
    copy_tree(cache.entry("build_retriever_index", fp) / "index", index.path)
    index.metadata.update({"fingerprint": fp, "passages": record["passages"], "run_id": record["run_id"],
                           "dvc_md5": data.metadata.get("dvc_md5", "")})
