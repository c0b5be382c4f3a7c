"""Chained arithmetic problems for a real pretrained policy: a difficulty that is the model's own.

A pretrained model fine-tuned on one program per problem kind learns to copy that program and its
numbers: on the single-kind generator (:mod:`trace_core.data.arith`) it solves nearly every
question of a kind it saw and none of a kind it did not, so RL has nothing to learn from. Here a
question's difficulty comes from what the model must carry over from what it saw, never from a
label we write:

- **kinds**: eight small computations (crates from two production runs, a modular power, a digit
  sum of a product, the digits of a power, a product's remainder, a sum of multiples, an order's
  total, a gcd), each one Python expression over its named quantities;
- **wordings**: four phrasings per kind, the quantities in a different order in each. The warm
  start sees only the first ``seen_wordings`` of every kind; a question in an unseen wording asks
  the model to map the same quantities to the same program from text it never saw;
- **chains**: a question of depth d chains d kinds, part k's answer replacing one quantity of
  part k + 1 (its *slot*) — "Part 2: Let N be the answer to part 1. …". The expert solves a chain
  one tool call per part, copying each printed result into the next program, so a depth-d
  trajectory has d + 1 turns and an error at any part is fatal.

Warm-start questions (:func:`warm_examples`) use seen wordings only and depth ≤ ``warm_max_depth``;
pool and held-out questions (:func:`pool_examples`, :func:`heldout_examples`) mix every wording
and depth by the configured weights. Every question carries its own answer, computed here, and
``metadata["solution_code"]`` (one program printing it; tests run it) and
``metadata["solution_steps"]`` (one program per part with ``{prev}`` for the previous part's
printed result: the expert's tool calls). Question ``i`` of a split is drawn from its own stream
``"<seed>/chains/<split>/<i>"``; prompts are unique across the three splits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trace_core.data.hashing import HashRng
from trace_core.data.schema import Example

SOURCE = "trace-chains"
SLOT_NAME = "N"  # how a chained part names the previous part's answer


@dataclass(frozen=True)
class Kind:
    """One computation: its quantities, its program, its phrasings."""

    name: str
    draw: Callable[[HashRng], dict[str, int]]  # the quantities of one question
    expr: str  # a Python expression over the quantities ({name} placeholders)
    slot: str  # the quantity a chained part takes from the previous answer
    wordings: tuple[str, ...]  # question texts ({name} placeholders; the slot may read "N")
    imports: tuple[str, ...] = ()  # modules the expression needs

    def value(self, q: dict[str, int]) -> int:
        """The exact answer, computed without running the program text."""
        return int(_EVALUATORS[self.name](q))

    def program(self, q: dict[str, Any]) -> str:
        """The program that prints the answer (``q`` may hold the text ``"{prev}"`` or a variable name)."""
        head = "".join(f"import {m}\n" for m in self.imports)
        return f"{head}print({self.expr.format(**q)})"


def _n(value: int) -> str:
    """A quantity as the question shows it: thousands separated by commas."""
    return f"{value:,}"


def _crates(rng: HashRng) -> dict[str, int]:
    return {"a": rng.randint(100, 9999), "d": rng.randint(5, 59), "b": rng.randint(100, 9999),
            "e": rng.randint(5, 59), "c": rng.randint(12, 144)}


def _powmod(rng: HashRng) -> dict[str, int]:
    return {"a": rng.randint(100, 99999), "k": rng.randint(20, 500), "m": rng.randint(100, 99999)}


def _digit_sum(rng: HashRng) -> dict[str, int]:
    return {"a": rng.randint(10**4, 10**8), "b": rng.randint(10**4, 10**8)}


def _power_digits(rng: HashRng) -> dict[str, int]:
    return {"a": rng.randint(2, 999), "k": rng.randint(10, 400)}


def _remainder(rng: HashRng) -> dict[str, int]:
    return {"a": rng.randint(100, 99999), "b": rng.randint(100, 99999), "c": rng.randint(100, 99999),
            "m": rng.randint(7, 997)}


def _multiples(rng: HashRng) -> dict[str, int]:
    return {"p": rng.randint(3, 97), "n": rng.randint(1000, 200000)}


def _order(rng: HashRng) -> dict[str, int]:
    a, c = rng.randint(2, 400), rng.randint(2, 400)
    b, e = rng.randint(3, 999), rng.randint(3, 999)
    return {"a": a, "b": b, "c": c, "e": e, "f": rng.randint(1, min(a * b, c * e))}


def _gcd(rng: HashRng) -> dict[str, int]:
    g = rng.randint(2, 300)
    return {"a": g * rng.randint(10, 3000), "b": g * rng.randint(10, 3000)}


_EVALUATORS: dict[str, Callable[[dict[str, int]], int]] = {
    "crates": lambda q: (q["a"] * q["d"] + q["b"] * q["e"]) // q["c"],
    "powmod": lambda q: pow(q["a"], q["k"], q["m"]),
    "digit_sum": lambda q: sum(int(ch) for ch in str(q["a"] * q["b"])),
    "power_digits": lambda q: len(str(q["a"] ** q["k"])),
    "remainder": lambda q: (q["a"] * q["b"] * q["c"]) % q["m"],
    "multiples": lambda q: sum(range(q["p"], q["n"], q["p"])),
    "order": lambda q: q["a"] * q["b"] + q["c"] * q["e"] - q["f"],
    "gcd": lambda q: math.gcd(q["a"], q["b"]),
}

KINDS: tuple[Kind, ...] = (
    Kind("crates", _crates, "({a} * {d} + {b} * {e}) // {c}", "a", (
        "A factory makes {a} widgets per day for {d} days, then {b} widgets per day for {e} days. "
        "Widgets are packed into crates of {c}. How many crates can be filled completely?",
        "Widgets are packed {c} to a crate. A factory produces {a} a day for {d} days and then {b} a day "
        "for {e} days. How many full crates does it fill?",
        "For {e} days a plant turns out {b} widgets daily, after {d} days at {a} widgets daily. If each crate "
        "holds {c} widgets, how many crates are completely full?",
        "How many complete crates of {c} can be packed from {d} days of production at {a} widgets a day "
        "followed by {e} days at {b} widgets a day?",
    )),
    Kind("powmod", _powmod, "pow({a}, {k}, {m})", "a", (
        "A lock's code is the remainder when {a} raised to the power {k} is divided by {m}. What is the code?",
        "What is {a} to the power {k}, modulo {m}?",
        "Divide {a}^{k} by {m}. What remainder is left?",
        "Take the modulus {m}. What is the remainder of the {k}-th power of {a}?",
    )),
    Kind("digit_sum", _digit_sum, "sum(int(ch) for ch in str({a} * {b}))", "a", (
        "What is the sum of the digits of {a} multiplied by {b}?",
        "Multiply {a} by {b}. What do the digits of the product add up to?",
        "Add up the digits of the product of {b} and {a}. What is the total?",
        "The product {a} times {b} is written out in full. What is the sum of its digits?",
    )),
    Kind("power_digits", _power_digits, "len(str({a} ** {k}))", "a", (
        "How many digits does {a} raised to the power {k} have?",
        "Write {a}^{k} out in full. How many digits is that?",
        "Count the decimal digits of the {k}-th power of {a}.",
        "If {a} is multiplied by itself {k} times, how many digits does the result have?",
    )),
    Kind("remainder", _remainder, "({a} * {b} * {c}) % {m}", "a", (
        "What is the remainder when the product of {a}, {b} and {c} is divided by {m}?",
        "Multiply {a}, {b} and {c} together. What is left over after dividing by {m}?",
        "Dividing by {m}: what remainder does {c} times {b} times {a} leave?",
        "Compute {a} * {b} * {c} modulo {m}.",
    )),
    Kind("multiples", _multiples, "sum(range({p}, {n}, {p}))", "p", (
        "What is the sum of all positive multiples of {p} that are less than {n}?",
        "Add up every multiple of {p} below {n}. What is the total?",
        "Below {n}, find every positive number divisible by {p}. What is their sum?",
        "List {p}, 2*{p}, 3*{p} and so on while the numbers stay under {n}. What do they add up to?",
    )),
    Kind("order", _order, "{a} * {b} + {c} * {e} - {f}", "a", (
        "An order has {a} items at {b} dollars each and {c} items at {e} dollars each, with a discount of "
        "{f} dollars. What is the total in dollars?",
        "A shop sells {a} chairs for {b} dollars apiece and {c} tables for {e} dollars apiece, then takes "
        "{f} dollars off the bill. How much is paid?",
        "After a {f}-dollar discount, what do {c} items at {e} dollars and {a} items at {b} dollars cost?",
        "Total cost: {b} dollars for each of {a} items plus {e} dollars for each of {c} items, minus {f} "
        "dollars. What is it?",
    )),
    Kind("gcd", _gcd, "math.gcd({a}, {b})", "a", (
        "What is the greatest common divisor of {a} and {b}?",
        "Find the largest whole number that divides both {a} and {b}.",
        "{b} and {a} share some divisors. What is the greatest of them?",
        "What is gcd({a}, {b})?",
    ), imports=("math",)),
)
KINDS_BY_NAME = {k.name: k for k in KINDS}
CHAIN_HEAD = "Solve the parts in order; each part uses the answer of the part before it."


@dataclass(frozen=True)
class ChainConfig:
    """Sizes, mix and seed of the chained problems."""

    n_warm: int = 480  # warm-start questions (demonstrated; never in the pool or the held-out set)
    n_pool: int = 128  # training pool (RL samples from it; pool success is measured on it)
    n_heldout: int = 320  # held-out questions (held-out pass@1 is measured on them)
    # the success predictor's warm-up split: made like the pool (every wording and depth), in no
    # other group; drawn last, so its size changes none of the other groups
    n_warmup: int = 128
    seen_wordings: int = 2  # the warm start sees wordings 0 .. seen_wordings-1 of every kind
    warm_depths: tuple[float, ...] = (0.6, 0.4)  # warm-start weight of depth 1, 2, … (len = deepest warm chain)
    depths: tuple[float, ...] = (0.35, 0.4, 0.25)  # pool and held-out weight of depth 1, 2, 3, …
    seed: int = 0  # changes every draw; part of each question's random stream

    def __post_init__(self) -> None:
        for name in ("n_warm", "n_pool", "n_heldout", "n_warmup"):
            if getattr(self, name) < 0:
                raise ValueError(f"ChainConfig.{name} must be >= 0, got {getattr(self, name)}")
        n_wordings = min(len(k.wordings) for k in KINDS)
        if not 1 <= self.seen_wordings <= n_wordings:
            raise ValueError(f"ChainConfig.seen_wordings must lie in [1, {n_wordings}], got {self.seen_wordings}")
        for name in ("warm_depths", "depths"):
            w = getattr(self, name)
            if not w or any(not (math.isfinite(x) and x >= 0) for x in w) or sum(w) <= 0:
                raise ValueError(f"ChainConfig.{name} must be non-negative weights with a positive sum, got {w}")


@dataclass(frozen=True)
class Part:
    """One part of a chain: its kind, wording and quantities (the slot holds the previous answer)."""

    kind: str
    wording: int
    quantities: dict[str, int] = field(default_factory=dict)


def _pick_depth(rng: HashRng, weights: Sequence[float]) -> int:
    total = sum(weights)
    u = rng.randint(0, 10**9 - 1) / 10**9 * total
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w
        if u < acc:
            return i + 1
    return len(weights)


def _fits(kind: Kind, prev: int) -> bool:
    """Whether ``prev`` makes a sane slot value for ``kind`` (a program that runs in milliseconds)."""
    if prev < 2:
        return False
    if kind.name == "power_digits":
        return prev < 10**6
    if kind.name == "multiples":
        return prev < 10**4
    if kind.name == "powmod":
        return True
    return prev < 10**12


def draw_chain(rng: HashRng, depth: int, wordings: Sequence[int]) -> list[Part]:
    """``depth`` parts of distinct kinds whose slots can take the previous answer."""
    for _ in range(100):
        parts: list[Part] = []
        prev: int | None = None
        used: set[str] = set()
        for _k in range(depth):
            options = [k for k in KINDS if k.name not in used and (prev is None or _fits(k, prev))]
            if not options:
                break
            kind = rng.choice(options)
            q = kind.draw(rng)
            if prev is not None:
                q[kind.slot] = prev
            parts.append(Part(kind.name, rng.choice(list(wordings)), q))
            used.add(kind.name)
            prev = kind.value(q)
        if len(parts) == depth:
            return parts
    raise ValueError(f"no chain of depth {depth} found in 100 draws")


def question_text(parts: Sequence[Part]) -> str:
    """The question: one wording, or the chain's parts with the slot read as N."""
    def words(part: Part, chained: bool) -> str:
        kind = KINDS_BY_NAME[part.kind]
        shown = {name: _n(v) for name, v in part.quantities.items()}
        if chained:
            shown[kind.slot] = SLOT_NAME
        return kind.wordings[part.wording].format(**shown)

    if len(parts) == 1:
        return words(parts[0], False)
    lines = [CHAIN_HEAD, f"Part 1: {words(parts[0], False)}"]
    for i, part in enumerate(parts[1:], start=2):
        lines.append(f"Part {i}: Let {SLOT_NAME} be the answer to part {i - 1}. {words(part, True)}")
    return "\n".join(lines)


def solution_steps(parts: Sequence[Part]) -> list[str]:
    """One program per part; a chained part's slot is ``{prev}``, the previous part's printed result."""
    steps = []
    for i, part in enumerate(parts):
        kind = KINDS_BY_NAME[part.kind]
        q: dict[str, Any] = dict(part.quantities)
        if i > 0:
            q[kind.slot] = "{prev}"
        steps.append(kind.program(q))
    return steps


def solution_code(parts: Sequence[Part]) -> str:
    """One program that prints the chain's answer."""
    lines = sorted({f"import {m}" for p in parts for m in KINDS_BY_NAME[p.kind].imports})
    for i, part in enumerate(parts):
        kind = KINDS_BY_NAME[part.kind]
        q: dict[str, Any] = dict(part.quantities)
        if i > 0:
            q[kind.slot] = "n"
        lines.append(f"n = {kind.expr.format(**q)}")
    lines.append("print(n)")
    return "\n".join(lines)


def chain_answer(parts: Sequence[Part]) -> int:
    value = 0
    for i, part in enumerate(parts):
        q = dict(part.quantities)
        if i > 0:
            q[KINDS_BY_NAME[part.kind].slot] = value
        value = KINDS_BY_NAME[part.kind].value(q)
    return value


def _examples(config: ChainConfig, group: str, n: int, depths: Sequence[float], wordings: Sequence[int],
              split: str, seen: set[str]) -> list[Example]:
    out = []
    i = 0
    while len(out) < n:
        rng = HashRng(f"{config.seed}/chains/{group}/{i}")
        i += 1
        parts = draw_chain(rng, _pick_depth(rng, depths), wordings)
        prompt = question_text(parts)
        if prompt in seen:
            continue
        seen.add(prompt)
        meta = {
            "solution_code": solution_code(parts),
            "solution_steps": solution_steps(parts),
            "depth": len(parts),
            "kinds": [p.kind for p in parts],
            "wordings": [p.wording for p in parts],
            "unseen_wordings": sum(p.wording >= config.seen_wordings for p in parts),
            "group": group,
        }
        out.append(Example(f"chains-{group}-{len(out):04d}", "math", SOURCE, split, prompt,
                           [str(chain_answer(parts))], [], meta))
    return out


def generate(config: ChainConfig = ChainConfig()) -> dict[str, list[Example]]:
    """The four groups: ``warm`` (split train), ``pool`` (split train), ``heldout`` (split test) and
    ``warmup`` (split train: the predictor's warm-up), each question in one group only."""
    seen: set[str] = set()
    all_wordings = range(min(len(k.wordings) for k in KINDS))
    warm = _examples(config, "warm", config.n_warm, config.warm_depths, range(config.seen_wordings), "train", seen)
    pool = _examples(config, "pool", config.n_pool, config.depths, all_wordings, "train", seen)
    heldout = _examples(config, "heldout", config.n_heldout, config.depths, all_wordings, "test", seen)
    warmup = _examples(config, "warmup", config.n_warmup, config.depths, all_wordings, "train", seen)
    return {"warm": warm, "pool": pool, "heldout": heldout, "warmup": warmup}
