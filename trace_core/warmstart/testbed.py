"""The embedded testbed: a multi-hop QA training pool whose difficulty is spread the way a
pretrained model's is over a training set — most prompts always or never solved, a minority mixed.

A tiny policy has no prior knowledge, so the spread is made, and this module says how. It stands
in for a real model's difficulty profile; nothing in it reaches the rollouts, the rewards or the
predictor:

* **Topics.** The questions of the embedded QA training split are grouped by the entity they
  start from (``metadata.path[0]``): the questions about one person, one company, ... A
  pretrained model's competence is topical — it knows some subjects and not others — and this
  is the regularity a success predictor can learn from outcomes on *other* questions.
* **Competence per topic.** Each topic draws, from ``seed`` alone, one of three kinds:
  *known* (every demonstration of its questions is right), *unknown* (every one is wrong: a
  coherent wrong trail or a wrong final value, at a step drawn per demonstration) or *partial*
  (each question gets ``d`` demonstrations, ``d`` drawn from ``partial_demos``, of which ``1 ..
  d − 1`` are right). The warm start fits the policy to these demonstrations, so at T = 1 it
  reproduces them: near 1 on known topics, near 0 on unknown ones, in between on partial ones —
  and imperfect fitting blurs each, as a real model's would.
* **Two disjoint splits** of the same topics: the **pool** (the RL training prompts) and the
  **warm-up split** (its other questions, on which the predictor may be fitted before RL). Both
  are made the same way; no question is in both.

What the trainer and the predictor get is the pool's and the warm-up split's question files
(the normalized rows of ``data/qa/train.jsonl``, unchanged): no tag, no grade, no competence.
The plan (which topic is which kind, which demonstration is wrong) lives only in the warm
start's output (``testbed.json``), for the report. :func:`testbed_hash` identifies a testbed: its
configuration and the data it was drawn from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from trace_core.data.hashing import HashRng

Competence = Literal["known", "unknown", "partial"]
_UNIT = 1 << 53


@dataclass(frozen=True)
class TestbedConfig:
    """How the testbed's pool, warm-up split and demonstration plan are drawn (module docstring)."""

    pool_size: int = 128  # RL training prompts
    warmup_per_topic: int = 1  # questions of each topic kept out of the pool for the predictor's warm-up
    max_hops: int = 3  # questions with at most this many hops (2-3: 3-4 turns, cheap to fit)
    known_share: float = 0.30  # share of topics whose demonstrations are all right
    unknown_share: float = 0.45  # share of topics whose demonstrations are all wrong (the rest: partial)
    partial_demos: tuple[int, ...] = (2, 3, 4)  # demonstrations per question of a partial topic (one drawn)
    known_demos: int = 1  # demonstrations per question of a known or unknown topic
    seed: int = 0  # draws the topics' competence, the splits and the wrong steps
    # The calibration target: GRPO's expected step-0 effective ratio (G = 8, the pool's mixed
    # share at k = 8) must land here; the paper's GRPO sits at 0.268.
    grpo_ratio_range: tuple[float, float] = (0.20, 0.40)

    def __post_init__(self) -> None:
        if self.pool_size < 1 or self.warmup_per_topic < 0:
            raise ValueError(f"testbed.pool_size must be >= 1 and warmup_per_topic >= 0, got "
                             f"{self.pool_size}, {self.warmup_per_topic}")
        if self.max_hops < 2:
            raise ValueError(f"testbed.max_hops must be >= 2 (the embedded questions have 2-4 hops), got "
                             f"{self.max_hops}")
        shares = (self.known_share, self.unknown_share)
        if any(not 0 <= s <= 1 for s in shares) or sum(shares) > 1:
            raise ValueError(f"testbed.known_share and unknown_share must be shares summing to <= 1, got {shares}")
        if not self.partial_demos or any(d < 2 for d in self.partial_demos):
            raise ValueError(f"testbed.partial_demos must list counts >= 2 (a partial question needs a right "
                             f"and a wrong demonstration), got {self.partial_demos}")
        lo, hi = self.grpo_ratio_range
        if not 0 <= lo <= hi <= 1:
            raise ValueError(f"testbed.grpo_ratio_range must be 0 <= low <= high <= 1, got {self.grpo_ratio_range}")
        if self.known_demos < 1:
            raise ValueError(f"testbed.known_demos must be >= 1, got {self.known_demos}")


@dataclass(frozen=True)
class DemoPlan:
    """One demonstration of one question: right, or wrong at one step."""

    task_id: str
    copy: int  # index among the question's demonstrations (seeds the expert's draws)
    corrupt_at: int | None  # None: right; else the step made wrong (0..hops-1: a search; hops: the answer)


@dataclass(frozen=True)
class Testbed:
    """A drawn testbed: the two splits (question ids, in file order) and the demonstration plan."""

    config: TestbedConfig
    source_md5: str  # md5 of the question file it was drawn from
    pool: tuple[str, ...]
    warmup: tuple[str, ...]
    competence: dict[str, Competence] = field(default_factory=dict)  # topic entity id -> kind
    plan: tuple[DemoPlan, ...] = ()

    @property
    def hash(self) -> str:
        return testbed_hash(self.config, self.source_md5)

    def to_json(self) -> dict[str, Any]:
        return {"hash": self.hash, "config": asdict(self.config), "source_md5": self.source_md5,
                "pool": list(self.pool), "warmup": list(self.warmup), "competence": self.competence,
                "plan": [asdict(p) for p in self.plan]}


def testbed_hash(config: TestbedConfig, source_md5: str) -> str:
    """A short hash of what determines the testbed — the settings of its draw and its source data
    (not the calibration target, which judges it) —, recorded with every result."""
    drawn = {k: v for k, v in asdict(config).items() if k != "grpo_ratio_range"}
    text = json.dumps({"config": drawn, "source_md5": source_md5}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _draw(rng: HashRng) -> float:
    return rng.randint(0, _UNIT - 1) / _UNIT


def draw_testbed(rows: Sequence[dict[str, Any]], config: TestbedConfig, source_md5: str = "") -> Testbed:
    """Draw the testbed from the QA training rows (normalized examples with ``metadata.path``).

    Topics with at least two eligible questions are used (a topic must reach both splits), in a
    seeded order, until the pool is full: each gives its first ``warmup_per_topic`` questions to
    the warm-up split and the rest to the pool. An error names the sizes when there are too few."""
    eligible = [r for r in rows if len(r["metadata"]["path"]) <= config.max_hops]
    topics: dict[str, list[dict[str, Any]]] = {}
    for r in eligible:
        topics.setdefault(r["metadata"]["path"][0]["entity_id"], []).append(r)
    topics = {t: qs for t, qs in topics.items() if len(qs) >= 2}
    order = sorted(topics, key=lambda t: HashRng(f"{config.seed}/testbed/order/{t}").randint(0, _UNIT - 1))
    pool: list[str] = []
    warmup: list[str] = []
    competence: dict[str, Competence] = {}
    for topic in order:  # each topic: its first warmup_per_topic questions to warm-up, the rest to the pool
        if len(pool) >= config.pool_size:
            break
        questions = topics[topic]
        k = min(config.warmup_per_topic, len(questions) - 1)
        warmup += [r["id"] for r in questions[:k]]
        pool += [r["id"] for r in questions[k:]][: config.pool_size - len(pool)]
        u = _draw(HashRng(f"{config.seed}/testbed/competence/{topic}"))
        competence[topic] = ("known" if u < config.known_share else
                             "unknown" if u < config.known_share + config.unknown_share else "partial")
    if len(pool) < config.pool_size:
        raise ValueError(f"the QA training split has {len(eligible)} questions of <= {config.max_hops} hops over "
                         f"{len(topics)} topics with >= 2 questions: not enough for testbed.pool_size="
                         f"{config.pool_size} with {config.warmup_per_topic} warm-up question(s) per topic")
    by_id = {r["id"]: r for r in eligible}
    plan: list[DemoPlan] = []
    for qid in sorted(pool + warmup):
        row = by_id[qid]
        kind = competence[row["metadata"]["path"][0]["entity_id"]]
        hops = len(row["metadata"]["path"])
        rng = HashRng(f"{config.seed}/testbed/plan/{qid}")
        if kind == "partial":
            d = config.partial_demos[rng.randint(0, len(config.partial_demos) - 1)]
            right = rng.randint(1, d - 1)
        else:
            d = config.known_demos
            right = d if kind == "known" else 0
        for copy in range(d):
            plan.append(DemoPlan(qid, copy, None if copy < right else rng.randint(0, hops)))
    return Testbed(config, source_md5, tuple(pool), tuple(warmup), competence, tuple(plan))


def read_rows(path: str | Path) -> tuple[list[dict[str, Any]], str]:
    """The JSON rows of a question file and the file's md5."""
    data = Path(path).read_bytes()
    rows = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    return rows, hashlib.md5(data).hexdigest()


def write_split(rows: Sequence[dict[str, Any]], ids: Sequence[str], path: str | Path) -> Path:
    """The rows whose ids are ``ids``, in that order, as a normalized JSONL question file."""
    by_id = {r["id"]: r for r in rows}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(by_id[i], sort_keys=True) + "\n" for i in ids), encoding="utf-8")
    return path


def testbed_scripts(testbed: Testbed, tasks: Sequence[Any], expert: Any, env_factory: Any = None,
                    attempts: int = 20) -> list[Any]:
    """The expert scripts of the plan (one per :class:`DemoPlan`), observations from
    ``env_factory``'s real environments when given. A wrong demonstration must end wrong: when
    the substituted entity happens to lead to the right answer too, the expert draws another
    (up to ``attempts`` seeds), else it is an error naming the question."""
    by_id = {t.id: t for t in tasks}
    scripts = []
    for p in testbed.plan:
        task = by_id[p.task_id]
        for attempt in range(attempts):
            seed = testbed.config.seed * 1_000_003 + p.copy * 1_009 + attempt
            env = env_factory(task) if env_factory is not None else None
            script = expert.script(task, 0.0, seed=seed, env=env, corrupt_at=p.corrupt_at)
            if script.correct == (p.corrupt_at is None):
                scripts.append(script)
                break
        else:
            raise ValueError(f"testbed question {p.task_id!r}: no wrong demonstration in {attempts} draws "
                             f"(corrupt_at={p.corrupt_at})")
    return scripts


@dataclass(frozen=True)
class Spread:
    """How a policy's success is spread over a pool: per prompt, successes out of ``samples``."""

    samples: int  # k rollouts per prompt at T = 1
    successes: dict[str, int]  # prompt id -> successful rollouts

    @property
    def histogram(self) -> list[int]:
        """Prompts with 0, 1, ..., k successes."""
        counts = [0] * (self.samples + 1)
        for s in self.successes.values():
            counts[s] += 1
        return counts

    @property
    def shares(self) -> dict[str, float]:
        """Shares of prompts never solved (0/k), always solved (k/k) and mixed."""
        n = len(self.successes) or 1
        h = self.histogram
        return {"never": h[0] / n, "always": h[-1] / n, "mixed": sum(h[1:-1]) / n}

    @property
    def largest_interior_bin_share(self) -> float:
        """The largest share of the mixed prompts that one interior bin (1..k−1 successes) holds."""
        interior = self.histogram[1:-1]
        return max(interior) / sum(interior) if sum(interior) else float("nan")

    @property
    def grpo_effective_ratio(self) -> float:
        """GRPO's step-0 effective ratio with groups of ``samples`` rollouts over uniformly drawn
        prompts, as measured here: the mixed share (its expectation over the draw)."""
        return self.shares["mixed"]

    @property
    def mean_success(self) -> float:
        return sum(self.successes.values()) / (self.samples * max(1, len(self.successes)))

    def to_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "histogram": self.histogram, "shares": self.shares,
                "largest_interior_bin_share": self.largest_interior_bin_share,
                "mean_success": self.mean_success, "successes": self.successes}


def spread_of(trees: Sequence[Any], samples: int) -> Spread:
    """The :class:`Spread` of bare-rollout trees (one per prompt, ``samples`` rollouts each), counted
    as every success rate is (:func:`trace_core.evaluation.success.count_successes`)."""
    from trace_core.evaluation.success import count_successes

    successes, finished = count_successes(trees)
    for prompt_id, n in finished.items():
        if n != samples:
            raise ValueError(f"prompt {prompt_id!r} has {n} finished rollouts, expected {samples}")
    return Spread(samples, successes)


def heldout_rows(test_rows: Sequence[dict[str, Any]], testbed: Testbed | dict[str, Any]) -> list[dict[str, Any]]:
    """The testbed's held-out questions: rows of the QA test split (never demonstrated, in
    neither the pool nor the warm-up split) that start from one of the testbed's topics and have
    at most ``max_hops`` hops — the questions on which a trained policy's pass@1 says whether what
    it learnt on the pool carries over to the same subjects."""
    bed = testbed.to_json() if isinstance(testbed, Testbed) else testbed  # one form: testbed.json's
    used = set(bed["pool"]) | set(bed["warmup"])
    return [r for r in test_rows if r["metadata"]["path"][0]["entity_id"] in bed["competence"]
            and len(r["metadata"]["path"]) <= bed["config"]["max_hops"] and r["id"] not in used]


def file_digest(paths: Sequence[Path]) -> str:
    """sha256 over the named files' relative names and bytes, in sorted order (16 hex digits)."""
    h = hashlib.sha256()
    for p in sorted(paths, key=lambda q: q.name):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def warm_start_code_digest() -> str:
    """A digest of the source that builds a testbed policy: the warm-start package, the tiny
    models' definition and weight draw, and the testbed draw itself."""
    import trace_core.models
    import trace_core.warmstart

    package = Path(trace_core.warmstart.__file__).parent
    return file_digest([*package.glob("*.py"), Path(trace_core.models.__file__)])


def testbed_identity(folder: str | Path) -> dict[str, str]:
    """What a result measured on the testbed warm start in ``folder`` depends on: the testbed's
    settings and source data (:func:`testbed_hash`), the policy's weights (a digest of its
    weight files) and the warm start's code now checked out. Two folders with one identity
    hold the same policy; a committed measurement is attached only to the identity it was
    measured on. The code digest is the one the warm start recorded when it built the folder,
    or, for a folder built before it recorded one, that of the code checked out now."""
    folder = Path(folder)
    bed = json.loads((folder / "testbed.json").read_text())
    weights = sorted((folder / "policy").glob("*.safetensors")) or sorted((folder / "policy").glob("*.bin"))
    if not weights:
        raise ValueError(f"{folder / 'policy'} holds no weight file (*.safetensors or *.bin)")
    return {"hash": bed["hash"], "policy_digest": file_digest(weights),
            "warm_start_code": bed.get("warm_start_code") or warm_start_code_digest()}
