"""Seeded arithmetic/algebra word problems that want the Python tool.

Every problem is multi-step with numbers too large for reliable mental arithmetic, and its
answer is exact: an integer, or a fraction in lowest terms written ``p/q`` (Python's
``str(Fraction)``). Each example carries ``metadata["solution_code"]``, a short program that
prints the answer — the scripted expert's tool call for warm-start demonstrations, and a check
that the stated answer is right (the tests run it).

Problem ``i`` of a split is drawn from its own stream ``"<seed>/arith/<split>/<i>"`` and uses
template ``i mod 10``, so the templates are balanced and growing a split keeps its first problems.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from trace_core.data.hashing import HashRng
from trace_core.data.schema import Example

SOURCE = "trace-arith"


@dataclass(frozen=True)
class ArithConfig:
    """Sizes and seed of the generated math problems."""

    n_train: int = 400  # training problems
    n_test: int = 100  # held-out problems (no prompt repeats a training prompt)
    seed: int = 0  # changes every draw; part of each problem's random stream


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: int | Fraction
    code: str  # prints the answer
    params: dict[str, int]
    steps: int  # arithmetic steps a solver needs (a rough difficulty label)


def answer_text(value: int | Fraction) -> str:
    """Exact answer text: ``"42"``, ``"-7/3"`` (lowest terms; an integral Fraction prints as an int)."""
    return str(Fraction(value))


def _crates(rng: HashRng) -> Problem:
    a, d, b, e = rng.randint(1000, 9999), rng.randint(11, 59), rng.randint(1000, 9999), rng.randint(11, 59)
    c = rng.randint(24, 144)
    prompt = (
        f"A factory makes {a:,} widgets per day for {d} days, then {b:,} widgets per day for {e} days. "
        f"Widgets are packed into crates of {c}. How many crates can be filled completely?"
    )
    code = f"total = {a} * {d} + {b} * {e}\nprint(total // {c})"
    return Problem(prompt, (a * d + b * e) // c, code, {"a": a, "d": d, "b": b, "e": e, "c": c}, 4)


def _powmod(rng: HashRng) -> Problem:
    a, k, m = rng.randint(1000, 99999), rng.randint(50, 500), rng.randint(1000, 99999)
    prompt = (
        f"A lock's code is the remainder when {a:,} raised to the power {k} is divided by {m:,}. "
        "What is the code?"
    )
    return Problem(prompt, pow(a, k, m), f"print(pow({a}, {k}, {m}))", {"a": a, "k": k, "m": m}, 3)


def _multiples(rng: HashRng) -> Problem:
    p = rng.randint(3, 40)
    q = rng.randint(3, 40)
    while q == p or q % p == 0 or p % q == 0:
        q = rng.randint(3, 40)
    n = rng.randint(10_000, 1_000_000)

    def s(k: int) -> int:  # sum of the positive multiples of k below n
        top = (n - 1) // k
        return k * top * (top + 1) // 2

    lcm = p * q // math.gcd(p, q)
    prompt = f"What is the sum of all positive integers below {n:,} that are divisible by {p} or by {q}?"
    code = f"n, p, q = {n}, {p}, {q}\nprint(sum(x for x in range(1, n) if x % p == 0 or x % q == 0))"
    return Problem(prompt, s(p) + s(q) - s(lcm), code, {"p": p, "q": q, "n": n}, 4)


def _linear_system(rng: HashRng) -> Problem:
    def coef() -> int:
        return rng.choice([-1, 1]) * rng.randint(2, 60)

    while True:
        a1, b1, a2, b2 = coef(), coef(), coef(), coef()
        det = a1 * b2 - a2 * b1
        if det != 0:
            break
    c1, c2 = rng.randint(-5000, 5000), rng.randint(-5000, 5000)
    x = Fraction(c1 * b2 - c2 * b1, det)
    y = Fraction(a1 * c2 - a2 * c1, det)

    def term(k: int, var: str, first: bool) -> str:
        if first:
            return f"{k}{var}"
        return f" {'-' if k < 0 else '+'} {abs(k)}{var}"

    eq1 = f"{term(a1, 'x', True)}{term(b1, 'y', False)} = {c1}"
    eq2 = f"{term(a2, 'x', True)}{term(b2, 'y', False)} = {c2}"
    prompt = f"Solve the system {eq1} and {eq2}. What is x + y? Give the exact value."
    code = (
        "from fractions import Fraction\n"
        f"a1, b1, c1, a2, b2, c2 = {a1}, {b1}, {c1}, {a2}, {b2}, {c2}\n"
        "det = a1 * b2 - a2 * b1\n"
        "x = Fraction(c1 * b2 - c2 * b1, det)\n"
        "y = Fraction(a1 * c2 - a2 * c1, det)\n"
        "print(x + y)"
    )
    params = {"a1": a1, "b1": b1, "c1": c1, "a2": a2, "b2": b2, "c2": c2}
    return Problem(prompt, x + y, code, params, 5)


def _interest(rng: HashRng) -> Problem:
    principal, rate, years = rng.randint(1000, 50000), rng.randint(2, 12), rng.randint(3, 8)
    prompt = (
        f"An account starts with {principal:,} dollars and earns {rate}% interest compounded once a year, "
        f"with no rounding. What is the balance after {years} years? Give the exact value."
    )
    code = f"from fractions import Fraction\nprint({principal} * Fraction(100 + {rate}, 100) ** {years})"
    value = principal * Fraction(100 + rate, 100) ** years
    return Problem(prompt, value, code, {"principal": principal, "rate": rate, "years": years}, years + 1)


def _digit_sum(rng: HashRng) -> Problem:
    a, b = rng.randint(10**6, 10**9), rng.randint(10**6, 10**9)
    prompt = f"What is the sum of the digits of {a:,} multiplied by {b:,}?"
    code = f"print(sum(int(ch) for ch in str({a} * {b})))"
    return Problem(prompt, sum(int(ch) for ch in str(a * b)), code, {"a": a, "b": b}, 3)


def _vieta(rng: HashRng) -> Problem:
    s, p = rng.randint(100, 999), rng.randint(1000, 99999)
    prompt = (
        f"Let r and t be the two roots of x^2 - {s}x + {p:,} = 0 (they may be complex). What is r^3 + t^3?"
    )
    code = f"s, p = {s}, {p}\nprint(s**3 - 3 * p * s)"
    return Problem(prompt, s**3 - 3 * p * s, code, {"s": s, "p": p}, 4)


def _gears(rng: HashRng) -> Problem:
    a, b, c = rng.randint(12, 997), rng.randint(12, 997), rng.randint(12, 997)
    prompt = (
        f"Three meshed gears have {a}, {b} and {c} teeth, and each has a mark on one tooth. "
        "The marks line up now. After how many teeth have passed the contact point will all three marks "
        "line up again for the first time?"
    )
    code = f"import math\nprint(math.lcm({a}, {b}, {c}))"
    return Problem(prompt, math.lcm(a, b, c), code, {"a": a, "b": b, "c": c}, 3)


def _dilution(rng: HashRng) -> Problem:
    volume, percent, rounds = rng.randint(200, 2000), rng.randint(10, 90), rng.randint(2, 5)
    drained = rng.randint(10, volume // 4)
    prompt = (
        f"A tank holds {volume:,} liters of a solution that is {percent}% acid. {rounds} times in a row, "
        f"{drained} liters are drained and replaced with pure water. How many liters of acid remain? "
        "Give the exact value."
    )
    code = (
        "from fractions import Fraction\n"
        f"v, d = {volume}, {drained}\n"
        f"print(Fraction({percent}, 100) * v * (1 - Fraction(d, v)) ** {rounds})"
    )
    value = Fraction(percent, 100) * volume * (1 - Fraction(drained, volume)) ** rounds
    return Problem(
        prompt,
        value,
        code,
        {"volume": volume, "percent": percent, "drained": drained, "rounds": rounds},
        rounds + 2,
    )


def _progression(rng: HashRng) -> Problem:
    first, step, days = rng.randint(100, 999), rng.randint(5, 99), rng.randint(30, 365)
    prompt = (
        f"A runner covers {first} meters on day 1 and each day {step} meters more than the day before. "
        f"How many meters has the runner covered in total after {days} days?"
    )
    code = f"print(sum({first} + {step} * k for k in range({days})))"
    return Problem(
        prompt,
        days * (2 * first + (days - 1) * step) // 2,
        code,
        {"first": first, "step": step, "days": days},
        3,
    )


TEMPLATES: dict[str, Callable[[HashRng], Problem]] = {
    "crates": _crates,
    "powmod": _powmod,
    "multiples": _multiples,
    "linear_system": _linear_system,
    "interest": _interest,
    "digit_sum": _digit_sum,
    "vieta": _vieta,
    "gears": _gears,
    "dilution": _dilution,
    "progression": _progression,
}


def _example(problem: Problem, template: str, split: str, index: int) -> Example:
    value = Fraction(problem.answer)
    metadata: dict[str, Any] = {
        "template": template,
        "params": problem.params,
        "answer_kind": "integer" if value.denominator == 1 else "fraction",
        "steps": problem.steps,
        "solution_code": problem.code,
    }
    return Example(
        id=f"arith-{split}-{index:05d}",
        task="math",
        source=SOURCE,
        split=split,
        prompt=problem.prompt,
        answers=[answer_text(value)],
        choices=[],
        metadata=metadata,
    )


def generate_split(split: str, n: int, seed: int = 0, taken: set[str] | None = None) -> list[Example]:
    """``n`` problems for ``split``; prompts in ``taken`` (e.g. the training prompts) are redrawn."""
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    taken = set() if taken is None else taken
    names = list(TEMPLATES)
    out = []
    for i in range(n):
        template = names[i % len(names)]
        attempt = 0
        while True:
            problem = TEMPLATES[template](HashRng(f"{seed}/arith/{split}/{i}/{attempt}"))
            if problem.prompt not in taken:
                break
            attempt += 1
        taken.add(problem.prompt)
        out.append(_example(problem, template, split, i))
    return out


def generate(config: ArithConfig = ArithConfig()) -> dict[str, list[Example]]:
    """Train and test problems, with no prompt shared between them."""
    taken: set[str] = set()
    train = generate_split("train", config.n_train, config.seed, taken)
    test = generate_split("test", config.n_test, config.seed, taken)
    return {"train": train, "test": test}
