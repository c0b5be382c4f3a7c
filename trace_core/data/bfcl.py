"""BFCL v4 multi-turn data from the installed ``bfcl-eval`` package: loading into the schema, the
deterministic 80/20 train/test split and the embedded subset.

BFCL v4 ships four multi-turn categories of 200 entries each, and entry ``multi_turn_<cat>_<n>``
is a perturbation of the same scenario ``n`` in every category (same backends, same task; the
long-context, missing-function and missing-parameter versions make it harder). The split is
therefore made per *scenario*, not per entry: training on ``multi_turn_base_7`` and testing on
``multi_turn_miss_param_7`` would leak the task. Exactly 40 of the 200 scenarios are test: those
whose hash is below the 41st smallest scenario hash, which keeps the split a pure function of the
entry id.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from trace_core.data.hashing import hash_unit
from trace_core.data.reading import ReadConfig, read_json_lines
from trace_core.data.schema import Example

CATEGORIES = ("multi_turn_base", "multi_turn_long_context", "multi_turn_miss_func", "multi_turn_miss_param")
N_SCENARIOS = 200  # entries per multi-turn category in BFCL v4
TEST_SCENARIOS = 40  # 20 % of N_SCENARIOS
_SPLIT_SALT = "bfcl-v4-multi-turn-scenario"
_ID_RE = re.compile(r"^(multi_turn_(?:base|long_context|miss_func|miss_param))_(\d+)$")


def bfcl_data_dir() -> Path:
    """``bfcl_eval/data`` of the installed package (ImportError if bfcl-eval is missing)."""
    import bfcl_eval  # optional, heavy dependency: imported on use

    return Path(bfcl_eval.__file__).resolve().parent / "data"


def bfcl_version() -> str:
    from importlib.metadata import version

    return version("bfcl-eval")


def parse_id(entry_id: str) -> tuple[str, int]:
    """``"multi_turn_miss_func_12"`` -> ``("multi_turn_miss_func", 12)``."""
    match = _ID_RE.match(entry_id)
    if match is None:
        raise ValueError(f"BFCL id {entry_id!r} is not a multi-turn id 'multi_turn_<category>_<n>'")
    return match.group(1), int(match.group(2))


def _scenario_unit(scenario: int) -> float:
    return hash_unit(f"{_SPLIT_SALT}:{scenario}")


@functools.cache
def _test_threshold() -> float:
    return sorted(_scenario_unit(s) for s in range(N_SCENARIOS))[TEST_SCENARIOS]


def bfcl_split(entry_id: str) -> str:
    """``"train"`` or ``"test"`` for a multi-turn entry; all categories of a scenario agree."""
    _, scenario = parse_id(entry_id)
    return "test" if _scenario_unit(scenario) < _test_threshold() else "train"


def answer_path(question_path: Path) -> Path:
    """BFCL keeps ground truth in ``possible_answer/<same file name>`` next to the questions."""
    return question_path.parent / "possible_answer" / question_path.name


def to_example(entry: dict[str, Any], ground_truth: list[list[str]], split: str | None = None) -> Example:
    """One BFCL multi-turn entry (question file row + its ground truth) in the schema."""
    category, scenario = parse_id(entry["id"])
    turns = entry["question"]
    first_user = next((m["content"] for turn in turns for m in turn if m.get("role") == "user"), "")
    metadata: dict[str, Any] = {
        "category": category,  # the test_category BFCL's multi_turn_checker expects
        "scenario": scenario,
        "turns": turns,  # per turn, the messages given to the model (a turn may be empty)
        "initial_config": entry["initial_config"],
        "involved_classes": entry["involved_classes"],
        "path": entry.get("path", []),
        "excluded_function": entry.get("excluded_function", []),
        "missed_function": entry.get("missed_function", {}),
        "ground_truth": ground_truth,  # per turn, the call strings of BFCL's possible answer
    }
    return Example(
        id=entry["id"],
        task="fc",
        source=f"bfcl_v4_{category}",
        split=split or bfcl_split(entry["id"]),
        prompt=first_user,
        answers=[json.dumps(calls, ensure_ascii=False) for calls in ground_truth],
        choices=[],
        metadata=metadata,
    )


def load_bfcl_file(path: str | Path, split: str | None = None, read: ReadConfig | None = None) -> list[Example]:
    """A BFCL multi-turn question file (JSON lines) joined with its possible-answer file.

    ``split`` overrides the scenario hash split (e.g. ``"test"`` to evaluate on everything);
    ``read`` bounds the row size of both files.
    """
    path = Path(path)
    read = read or ReadConfig()
    entries, _ = read_json_lines(path, read)
    answers_file = answer_path(path)
    if not answers_file.exists():
        raise ValueError(
            f"{path}: ground truth file {answers_file} not found (BFCL's possible_answer layout)"
        )
    truth = {row["id"]: row["ground_truth"] for row in read_json_lines(answers_file, read)[0]}
    missing = [e["id"] for e in entries if e["id"] not in truth]
    if missing:
        raise ValueError(f"{path}: no ground truth in {answers_file} for ids {missing[:10]}")
    return [to_example(e, truth[e["id"]], split) for e in entries]


def load_bfcl_category(category: str, data_dir: str | Path | None = None) -> list[Example]:
    """All 200 entries of one multi-turn category from the installed bfcl-eval data."""
    if category not in CATEGORIES:
        raise ValueError(f"category={category!r} must be one of {CATEGORIES}")
    root = Path(data_dir) if data_dir is not None else bfcl_data_dir()
    return load_bfcl_file(root / f"BFCL_v4_{category}.json")


def subset_scenarios(n_scenarios: int) -> list[int]:
    """The embedded subset: ``n_scenarios`` scenarios, 80 % train and 20 % test, sorted.

    Within each split scenarios are taken in the order of an independent hash, so growing
    ``n_scenarios`` only adds scenarios.
    """
    if not 5 <= n_scenarios <= N_SCENARIOS or n_scenarios % 5:
        raise ValueError(f"n_scenarios={n_scenarios} must be a multiple of 5 in [5, {N_SCENARIOS}]")
    n_test = n_scenarios // 5
    order = sorted(range(N_SCENARIOS), key=lambda s: hash_unit(f"bfcl-subset:{s}"))
    test = [s for s in order if bfcl_split(f"multi_turn_base_{s}") == "test"][:n_test]
    train = [s for s in order if bfcl_split(f"multi_turn_base_{s}") == "train"][: n_scenarios - n_test]
    return sorted(test + train)


def bfcl_subset(n_scenarios: int = 60, data_dir: str | Path | None = None) -> list[Example]:
    """The chosen scenarios in all four categories, ordered by (scenario, category)."""
    keep = set(subset_scenarios(n_scenarios))
    rows = []
    for category in CATEGORIES:
        rows += [ex for ex in load_bfcl_category(category, data_dir) if ex.metadata["scenario"] in keep]
    return sorted(rows, key=lambda ex: (ex.metadata["scenario"], CATEGORIES.index(ex.metadata["category"])))
