"""Tree training benchmark: peak memory and throughput of one packed tree's forward + backward.

Workload: one rollout tree with 48 leaves — 16 bare rollouts of 5–8 turns, each expanded once
with N = 2 continuations from an interior turn (TRACE's ``M = 16, N = 2``) — under a prompt
as long as ``--prompt-turns`` turns (system prompt and tool schemas). The structure is fixed by
the seed; the packed (distinct) tokens are grown by the turn length alone, to 4k, 16k, 64k and
128k. A turn is 60% model-written tokens (trained), 40% observation. The sharing ratio is
``Σ root-to-leaf path lengths / distinct tokens``, what per-leaf training repeats.

Model: a tiny random Qwen3 (built from a config in-process, never downloaded), fp32 on CPU.
Loss: an advantage-weighted token log-prob sum over the model-written tokens (the policy
update's shape), forward + backward.

Paths, all through :func:`trace_core.tree_packing.logprobs.packed_token_logprobs` (the LM head in
vocabulary chunks for all three, so they differ only in attention and packing):

- (a) ``tree``: the packed tree (each distinct token once) with the sparse tree attention;
- (b) ``dense``: the packed tree with the dense ``L × L`` tree mask through ``sdpa`` (today's
  path before the tree kernel); skipped where its projected peak exceeds ``--budget-gib``;
- (c) ``varlen``: every root-to-leaf path as its own sequence, the 48 concatenated into one
  variable-length packed batch (how verl and TRL train: shared prefixes repeated). Its
  block-diagonal causal attention runs through the same segment-wise kernel (one segment per
  sequence), so (c) gets the best kernel this machine has and the comparison isolates sharing.

Measurement: each (size, path) runs in a fresh subprocess: build the model and the inputs,
warm the kernels up on a small tree, then reset the kernel's peak-RSS counter
(``/proc/self/clear_refs``) and run once; peak = ``VmHWM`` − the post-load ``VmRSS``. Times are
this process's CPU seconds on one thread (other load on a shared machine does not inflate them),
wall seconds reported too. Tokens/s count *distinct* tokens (the tree's) for every path.
A size whose projected peak (linear for (a)/(c) from the previous size, quadratic for (b)) is
over the budget is skipped, and the JSON says so.

    python -m bench.tree_training [--sizes 4k,16k,64k,128k] [--out bench/results/tree_training.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.bench_tables import places, print_table

REPO = Path(__file__).resolve().parents[1]
PATHS = ("tree", "dense", "varlen")
LABELS = {"tree": "(a) tree attention", "dense": "(b) dense mask", "varlen": "(c) per-leaf varlen"}
TAGS = {p: label.split()[0] for p, label in LABELS.items()}  # (a), (b), (c): the table's column prefixes


@dataclass(frozen=True)
class TreeShape:
    """The benchmark tree's structure (its token counts scale with the turn length)."""

    bare: int = 16  # bare rollouts from the prompt (M)
    expansion: int = 2  # continuations from one interior turn of each bare rollout (N)
    min_turns: int = 5  # turns of a bare rollout, drawn uniformly in [min_turns, max_turns]
    max_turns: int = 8
    prompt_turns: float = 4.0  # prompt length in turn lengths (system prompt + tool schemas)
    model_share: float = 0.6  # model-written share of a turn (the rest is the observation)
    jitter: float = 0.5  # a turn's length is turn_len × U[1 − jitter, 1 + jitter]
    seed: int = 0


@dataclass(frozen=True)
class TinyModel:
    """The random Qwen3 trained here (untied embeddings, as the Qwen3 family)."""

    vocab_size: int = 4096
    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    max_position_embeddings: int = 65536
    seed: int = 0


def parse_size(text: str) -> int:
    text = text.strip().lower()
    return int(float(text[:-1]) * 1024) if text.endswith("k") else int(text)


def size_label(size: int) -> str:
    return f"{size // 1024}k" if size % 1024 == 0 else str(size)


# ============================================================================ the workload
def tree_skeleton(shape: TreeShape):
    """Per node (parent, relative length), the prompt first: the structure at every size."""
    import numpy as np

    rng = np.random.default_rng(shape.seed)
    nodes: list[tuple[int, float]] = [(-1, shape.prompt_turns)]

    def turn(parent: int) -> int:
        nodes.append((parent, float(rng.uniform(1 - shape.jitter, 1 + shape.jitter))))
        return len(nodes) - 1

    for _ in range(shape.bare):
        n_turns = int(rng.integers(shape.min_turns, shape.max_turns + 1))
        chain = [0]
        for _ in range(n_turns):
            chain.append(turn(chain[-1]))
        depth = int(rng.integers(1, n_turns))  # an interior turn (not the leaf)
        for _ in range(shape.expansion):
            node = chain[depth]
            for _ in range(n_turns - depth):  # continuations run to the rollout's depth
                node = turn(node)
    return nodes


def build_tree(shape: TreeShape, distinct_tokens: int, vocab: int):
    """A ``RolloutTree`` of the skeleton with about ``distinct_tokens`` tokens, and its advantages."""
    import numpy as np

    from trace_core.tree import RolloutTree

    skeleton = tree_skeleton(shape)
    rel = np.array([r for _, r in skeleton])
    if distinct_tokens < 2 * rel.size:
        raise ValueError(f"{distinct_tokens} tokens is too few for {rel.size} nodes (2 each at least)")
    turn_len = distinct_tokens / rel.sum()
    # largest-remainder rounding: exactly distinct_tokens, each node at least 2 (1 model-written)
    exact = np.maximum(rel * turn_len, 2.0)
    exact *= distinct_tokens / exact.sum()
    lengths = np.maximum(np.floor(exact).astype(np.int64), 2)
    short = distinct_tokens - int(lengths.sum())
    if short > 0:
        lengths[np.argsort(-(exact - np.floor(exact)), kind="stable")[:short]] += 1
    while lengths.sum() > distinct_tokens:  # only when the 2-token floor bit
        lengths[int(np.argmax(lengths))] -= 1
    lengths = lengths.tolist()
    rng = np.random.default_rng(shape.seed + 1)
    tree = RolloutTree("bench", rng.integers(0, vocab, size=lengths[0]).tolist())
    children: dict[int, list[int]] = {}
    for i, (parent, _) in enumerate(skeleton[1:], start=1):
        children.setdefault(parent, []).append(i)
    tree_id = {0: 0}
    # one trajectory per leaf-ending chain: walk skeleton nodes in id order, opening a trajectory
    # at each node whose parent already has an earlier child (or is the prompt)
    traj_of: dict[int, int] = {}
    for i, (parent, _) in enumerate(skeleton[1:], start=1):
        if parent == 0:
            traj_of[i] = tree.start_trajectory("bare")
        elif children[parent][0] == i and parent in traj_of:
            traj_of[i] = traj_of[parent]
        else:
            traj_of[i] = tree.start_trajectory("continuation", branch_node=tree_id[parent])
        n = lengths[i]
        n_model = max(1, round(n * shape.model_share))
        ids = rng.integers(0, vocab, size=n).tolist()
        tree_id[i] = tree.add_turn(traj_of[i], ids, [1] * n_model + [0] * (n - n_model),
                                   logprobs=[-1.0] * n)
        if i not in children:
            tree.finish(traj_of[i], float(rng.integers(0, 2)))
    adv = rng.standard_normal(len(tree.nodes))
    return tree, adv, turn_len


def tree_stats(tree) -> dict[str, float]:
    distinct = sum(len(n.token_ids) for n in tree.nodes)
    paths = sum(len(tree.history_tokens(leaf)) for leaf in tree.leaves())
    return {"distinct_tokens": distinct, "path_tokens": paths, "sharing_ratio": paths / distinct,
            "leaves": len(tree.leaves()), "nodes": len(tree.nodes),
            "longest_path": max(len(tree.history_tokens(leaf)) for leaf in tree.leaves())}


def inputs_for(path: str, tree, adv):
    """(pack, predecessor, loss mask, per-token weight) of the path's one forward."""
    import numpy as np

    from trace_core.training.ppo import pack_trees_for_training, packed_predecessors
    from trace_core.tree_packing.layout import history_tokens, pack_token_trees

    if path in ("tree", "dense"):
        ((pack, targets),) = pack_trees_for_training([tree], [adv], max_tokens_per_forward=1 << 62)
        return pack, targets.predecessor, targets.loss_mask, targets.advantage
    leaves = tree.leaves()
    (pack,) = pack_token_trees([history_tokens(tree.history_tokens(leaf)) for leaf in leaves], None, 1 << 62)
    mask = np.concatenate([np.asarray(tree.history_loss_mask(leaf), dtype=bool) for leaf in leaves])
    weight = np.concatenate([np.concatenate([np.full(len(tree.nodes[n].token_ids), adv[n]) for n in tree.path(leaf)])
                             for leaf in leaves])
    return pack, packed_predecessors(pack), mask, np.where(mask, weight, 0.0).astype(np.float32)


# ============================================================================ one measurement
def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def worker(size: int, path: str, shape: TreeShape, spec: TinyModel, out: Path) -> None:
    """One (size, path) in this fresh process; writes its figures as JSON to ``out``."""
    import gc

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from trace_core.tree_packing.attention import build_plan, model_attention, plan_summary
    from trace_core.tree_packing.logprobs import install_logprob_head, packed_token_logprobs

    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)
    fields = {k: v for k, v in asdict(spec).items() if k != "seed"}
    model = Qwen3ForCausalLM(Qwen3Config(**fields, tie_word_embeddings=False, attention_dropout=0.0))
    attn = "sdpa" if path == "dense" else "tree"
    model.config._attn_implementation = model_attention(attn)
    install_logprob_head(model)
    model.train()
    device = torch.device("cpu")

    def step(tree, adv) -> None:
        pack, pred, mask, weight = inputs_for(path, tree, adv)
        logp = packed_token_logprobs(model, pack, pred, mask, device, attn)
        loss = -(logp * torch.as_tensor(weight)).sum() / max(int(mask.sum()), 1)
        loss.backward()

    warm_tree, warm_adv = build_tree(shape, 1024, spec.vocab_size)[:2]
    step(warm_tree, warm_adv)  # kernels, allocator pools, lazy imports
    tree, adv = build_tree(shape, size, spec.vocab_size)[:2]
    model.zero_grad(set_to_none=False)  # gradients stay allocated: the baseline holds them
    gc.collect()
    baseline = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    wall, cpu = time.perf_counter(), time.process_time()
    step(tree, adv)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = _status_kib("VmHWM")
    pack = inputs_for(path, tree, adv)[0]
    result = {
        "packed_tokens": pack.num_tokens, "peak_mib": (peak - baseline) / 1024, "baseline_mib": baseline / 1024,
        "cpu_s": cpu, "wall_s": wall, "distinct_tokens_per_s": tree_stats(tree)["distinct_tokens"] / cpu,
        "processed_tokens_per_s": pack.num_tokens / cpu,
    }
    if attn == "tree":
        result["plan"] = plan_summary(build_plan(pack, device))
    out.write_text(json.dumps(result))


def measure(size: int, path: str, shape: TreeShape, spec: TinyModel, timeout: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "bench.tree_training", "--worker", path, "--sizes", str(size),
               "--worker-out", str(out), "--shape", json.dumps(asdict(shape)), "--model", json.dumps(asdict(spec))]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO), "DS_ACCELERATOR": "cpu", "TRANSFORMERS_VERBOSITY": "error"}
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout} s"}
        if proc.returncode != 0 or not out.exists():
            return {"error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
        return json.loads(out.read_text())


# ============================================================================ the report
def projected_peak(path: str, size: int, done: dict[int, dict]) -> float | None:
    """Peak (MiB) at ``size`` projected from the largest smaller measured size: linear for the
    segment-wise paths, quadratic for the dense mask."""
    prev = [s for s in done if s < size and "peak_mib" in done[s].get(path, {})]
    if not prev:
        return None
    s = max(prev)
    power = 2 if path == "dense" else 1
    return done[s][path]["peak_mib"] * (size / s) ** power


def targets(rows: list[dict]) -> dict:
    by_size = {r["size"]: r for r in rows}
    out: dict = {}
    a16, a64 = (by_size.get(s, {}).get("paths", {}).get("tree", {}) for s in (16384, 65536))
    if "peak_mib" in a16 and "peak_mib" in a64:
        ratio = a64["peak_mib"] / a16["peak_mib"]
        out["tree_peak_64k_over_16k"] = {
            "value": ratio, "target": "<= 4.5", "met": ratio <= 4.5,
            "reason": None if ratio <= 4.5 else "peak grows faster than linear in the packed tokens"}
    speed = {}
    for r in rows:
        a, c = r["paths"].get("tree", {}), r["paths"].get("varlen", {})
        if "distinct_tokens_per_s" in a and "distinct_tokens_per_s" in c and r["sharing_ratio"] >= 2:
            speed[r["label"]] = a["distinct_tokens_per_s"] / c["distinct_tokens_per_s"]
    if speed:
        ok = all(v >= 1.5 for v in speed.values())
        out["tree_over_varlen_distinct_tokens_per_s"] = {
            "value": speed, "target": ">= 1.5 at sharing ratio >= 2", "met": ok,
            "reason": None if ok else "below 1.5 at the sizes listed"}
    dense = {r["label"]: ("measured" if "peak_mib" in r["paths"].get("dense", {})
                          else r["paths"].get("dense", {}).get("skipped") or r["paths"].get("dense", {}).get("error"))
             for r in rows if "dense" in r["paths"]}
    if dense:
        ok = any(v == "measured" for v in dense.values())
        out["dense_reported_where_it_fits"] = {"value": dense, "met": ok,
                                               "reason": None if ok else "no size fitted or ran"}
    return out


def table_row(row: dict) -> dict:
    """One size's line: per path its peak and throughput, or why it has none (skipped, error)."""
    out = {"size": row["label"], "tokens": row["distinct_tokens"], "share": row["sharing_ratio"]}
    for p in PATHS:
        m = row["paths"].get(p, {})
        out[f"{TAGS[p]} peak MiB"] = m["peak_mib"] if "peak_mib" in m else (
            "skipped" if "skipped" in m else "error" if "error" in m else None)
        out[f"{TAGS[p]} distinct tok/s"] = m.get("distinct_tokens_per_s")
    return out


def print_size_table(rows: list[dict]) -> None:
    digits = {"share": 2, **{f"{TAGS[p]} peak MiB": 1 for p in PATHS},
              **{f"{TAGS[p]} distinct tok/s": 0 for p in PATHS}}
    print_table([table_row(r) for r in rows], fmt=places(digits), title=", ".join(LABELS[p] for p in PATHS))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_mem, ax_tps) = plt.subplots(1, 2, figsize=(11, 4.2))
    for p, marker in zip(PATHS, "osd", strict=True):
        xs = [r["distinct_tokens"] for r in rows if "peak_mib" in r["paths"].get(p, {})]
        if not xs:
            continue
        mem = [r["paths"][p]["peak_mib"] for r in rows if "peak_mib" in r["paths"].get(p, {})]
        tps = [r["paths"][p]["distinct_tokens_per_s"] for r in rows if "peak_mib" in r["paths"].get(p, {})]
        ax_mem.plot(xs, mem, marker=marker, label=LABELS[p])
        ax_tps.plot(xs, tps, marker=marker, label=LABELS[p])
    for ax in (ax_mem, ax_tps):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("distinct (packed) tokens of the tree")
        ax.grid(alpha=0.3)
    ax_mem.set_yscale("log")
    ax_mem.set_ylabel("peak RSS rise, forward + backward (MiB)")
    ax_tps.set_ylabel("distinct tokens / CPU second (1 thread)")
    ax_mem.legend()
    sharing = ", ".join(f"{r['sharing_ratio']:.2f}" for r in rows)
    fig.suptitle(f"Tree training on CPU, tiny Qwen3, 48 leaves (sharing ratio {sharing})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.tree_training",
                                 epilog="Example:\n  python -m bench.tree_training --sizes 4k,16k --paths tree,dense",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4k,16k,64k,128k", help="distinct tokens of the tree, comma-separated")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"subset of {','.join(PATHS)}")
    ap.add_argument("--budget-gib", type=float, default=12.0, help="skip a run whose projected peak exceeds this")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per (size, path) subprocess")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "tree_training.json"))
    ap.add_argument("--plot", default=None, help="figure path (default: --out with .png)")
    # a (size, path) measurement runs this script again in a fresh process with these
    ap.add_argument("--worker", choices=PATHS, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    return ap


def measure_path(size: int, p: str, stats: dict, done: dict[int, dict], shape: TreeShape, spec: TinyModel,
                 args: argparse.Namespace) -> dict:
    """One (size, path): measured, or skipped where its projected peak is over the budget."""
    label = size_label(size)
    est = projected_peak(p, size, done)
    if p == "dense" and est is None:  # nothing measured yet: the mask's own bytes
        est = 7 * stats["distinct_tokens"] ** 2 / 2**20
    if est is not None and est > args.budget_gib * 1024:
        skipped = f"projected peak {est / 1024:.1f} GiB > budget {args.budget_gib:g} GiB"
        print(f"{label:>6} {p:>7}: skipped ({skipped})", flush=True)
        return {"skipped": skipped, "projected_peak_mib": est}
    m = measure(size, p, shape, spec, args.timeout)
    if "peak_mib" in m:
        print(f"{label:>6} {p:>7}: peak {m['peak_mib']:8.1f} MiB  {m['cpu_s']:7.2f} CPU s  "
              f"{m['distinct_tokens_per_s']:8.0f} distinct tok/s  (sharing {stats['sharing_ratio']:.2f})", flush=True)
    else:
        print(f"{label:>6} {p:>7}: {m['error']}", flush=True)
    return m


def measure_sizes(sizes: list[int], paths: list[str], shape: TreeShape, spec: TinyModel,
                  args: argparse.Namespace) -> list[dict]:
    """Per size, the tree's statistics and every path's figures (smaller sizes first: their peaks
    project the larger ones')."""
    rows: list[dict] = []
    done: dict[int, dict] = {}
    for size in sizes:
        stats = tree_stats(build_tree(shape, size, spec.vocab_size)[0])
        row = {"size": size, "label": size_label(size), **stats, "paths": {}}
        done[size] = row["paths"]
        for p in paths:
            row["paths"][p] = measure_path(size, p, stats, done, shape, spec, args)
        rows.append(row)
    return rows


def write_report(args: argparse.Namespace, argv: list[str] | None, shape: TreeShape, spec: TinyModel,
                 rows: list[dict], verdicts: dict) -> None:
    import platform

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = Path(args.plot) if args.plot else out.with_suffix(".png")
    plot(rows, fig)
    report = {
        "command": " ".join(["python", "-m", "bench.tree_training", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                    "threads": 1},
        "tree_shape": asdict(shape), "model": asdict(spec), "budget_gib": args.budget_gib,
        "measure": "peak = VmHWM after a clear_refs reset − post-load VmRSS, one forward + backward per fresh "
                   "subprocess after a warm-up; tokens/s = distinct tree tokens / CPU seconds (one thread)",
        "sizes": rows, "targets": verdicts, "figure": str(fig.relative_to(REPO) if fig.is_relative_to(REPO) else fig),
    }
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out} and {fig}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    shape = TreeShape(**json.loads(args.shape)) if args.shape else TreeShape()
    spec = TinyModel(**json.loads(args.model)) if args.model else TinyModel()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.worker:
        worker(sizes[0], args.worker, shape, spec, Path(args.worker_out))
        return 0

    rows = measure_sizes(sizes, [p for p in args.paths.split(",") if p], shape, spec, args)
    print_size_table(rows)
    verdicts = targets(rows)
    for name, v in verdicts.items():
        print(f"target {name}: {v['value']} ({'met' if v['met'] else 'missed: ' + str(v['reason'])})")
    write_report(args, argv, shape, spec, rows, verdicts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
