"""Chained math problems: every answer is right, the splits are disjoint, the warm split shows
only what it promises, and the expert solves a chain one tool call per part in the real sandbox."""

from __future__ import annotations

import dataclasses

import pytest

from trace_core.data.chains import KINDS, ChainConfig, generate, question_text, solution_steps
from trace_core.envs.registry import example_to_task
from trace_core.warmstart.experts import MathExpert
from trace_core.warmstart.tools import run_trusted_python

SMALL = ChainConfig(n_warm=60, n_pool=40, n_heldout=60, n_warmup=30)


@pytest.fixture(scope="module")
def groups():
    return generate(SMALL)


def test_every_solution_program_prints_the_stated_answer(groups):
    for examples in groups.values():
        for e in examples:
            assert run_trusted_python(e.metadata["solution_code"]).strip() == e.answers[0], e.id


def test_chained_parts_run_one_after_another_to_the_answer(groups):
    chains = [e for e in groups["pool"] + groups["heldout"] if e.metadata["depth"] > 1]
    assert chains
    for e in chains:
        out = ""
        for step in e.metadata["solution_steps"]:
            out = run_trusted_python(step.replace("{prev}", out.strip())).strip()
        assert out == e.answers[0], e.id


def test_splits_are_disjoint_and_the_warm_split_shows_only_seen_wordings_and_shallow_chains(groups):
    prompts = [e.prompt for examples in groups.values() for e in examples]
    assert len(prompts) == len(set(prompts))
    assert [len(groups[g]) for g in ("warm", "pool", "heldout", "warmup")] == [60, 40, 60, 30]
    warm = groups["warm"]
    assert all(w < SMALL.seen_wordings for e in warm for w in e.metadata["wordings"])
    assert max(e.metadata["depth"] for e in warm) <= len(SMALL.warm_depths)
    later = groups["pool"] + groups["heldout"]
    assert any(e.metadata["unseen_wordings"] for e in later)
    assert max(e.metadata["depth"] for e in later) == len(SMALL.depths)
    assert {e.split for e in warm} == {"train"} and {e.split for e in groups["heldout"]} == {"test"}


def test_generation_is_deterministic_and_the_seed_redraws_it(groups):
    again = generate(SMALL)
    assert [e.to_record() for e in again["pool"]] == [e.to_record() for e in groups["pool"]]
    other = generate(dataclasses.replace(SMALL, seed=1))
    assert other["pool"][0].prompt != groups["pool"][0].prompt
    # the predictor's warm-up split is drawn last: its size changes no other group (the questions a
    # committed measurement names stay the same), and it is made like the pool
    without = generate(dataclasses.replace(SMALL, n_warmup=0))
    assert without["warmup"] == [] and all([e.to_record() for e in without[g]] == [e.to_record() for e in groups[g]]
                                           for g in ("warm", "pool", "heldout"))
    assert max(e.metadata["depth"] for e in groups["warmup"]) == len(SMALL.depths)
    assert any(e.metadata["unseen_wordings"] for e in groups["warmup"]) and {e.split for e in groups["warmup"]} == {
        "train"}


def test_a_chained_question_names_the_previous_answer_and_its_programs_take_it():
    from trace_core.data.chains import Part

    parts = [Part("gcd", 0, {"a": 120, "b": 84}), Part("power_digits", 1, {"a": 0, "k": 30})]
    text = question_text(parts)
    assert "Part 1: What is the greatest common divisor of 120 and 84?" in text
    assert "Part 2: Let N be the answer to part 1. Write N^30 out in full." in text
    assert solution_steps(parts) == ["import math\nprint(math.gcd(120, 84))", "print(len(str({prev} ** 30)))"]


@pytest.mark.parametrize("field,value", [("seen_wordings", 0), ("seen_wordings", 9), ("depths", ()),
                                         ("warm_depths", (0.0, 0.0)), ("n_pool", -1)])
def test_bad_config_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ChainConfig(**{field: value})


def test_every_kind_has_as_many_wordings():
    assert len({len(k.wordings) for k in KINDS}) == 1


def test_the_expert_solves_a_chain_one_call_per_part_in_the_real_sandbox(groups):
    from trace_core.envs.registry import make_env_factory

    factory = make_env_factory("math")
    deep = next(e for e in groups["pool"] if e.metadata["depth"] == 3)
    task = example_to_task(deep)
    script = MathExpert().script(task, 0.0, env=factory(task))
    assert script.correct
    calls = [s for s in script.steps if s.tool == "python"]
    assert len(calls) == 3 and script.steps[-1].final_answer == f"\\boxed{{{deep.answers[0]}}}"
    # each later call copies what the previous one printed
    for before, after in zip(calls, calls[1:], strict=False):
        assert before.observation.strip() in after.arguments["code"]
