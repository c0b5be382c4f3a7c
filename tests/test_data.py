"""Datasets: loaders on fixtures of each published format, the Great Expectations suites, the
embedded generators (determinism, the hash in data.dvc, internal consistency) and the splits."""

from __future__ import annotations

import contextlib
import filecmp
import io
import json
from collections import Counter
from pathlib import Path

import pytest

from trace_core.data import arith, bfcl, kb
from trace_core.data.generate import dvc_dir_md5, dvc_recorded_md5, generate, main, validate_dir
from trace_core.data.hashing import HashRng, hash_split, hash_unit
from trace_core.data.loaders import load_dataset, read_records
from trace_core.data.schema import Example, jsonl_line
from trace_core.data.validation import DataValidationError, load_validated, validate_examples

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "data"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "data"
    generate(out)
    return out


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------------------------- loaders
def test_math_loaders_map_published_fields() -> None:
    ds = load_dataset("deepscaler", FIX / "deepscaler.json", validate=False)
    assert [e.id for e in ds] == ["deepscaler-000000", "deepscaler-000001", "deepscaler-000002"]
    assert {e.split for e in ds} == {"train"} and ds[2].answers == ["\\frac{2}{3}"]
    assert ds[0].metadata["solution"].endswith("$\\boxed{30}$.")

    aime = load_dataset("aime24", FIX / "aime24.parquet", validate=False)
    assert [(e.id, e.answers, e.metadata["year"]) for e in aime] == [
        ("aime24-60", ["500"], "2024"),
        ("aime24-61", ["370"], "2024"),
    ]
    amc = load_dataset("amc23", FIX / "amc23.jsonl", validate=False)
    assert [e.answers[0] for e in amc] == ["3", "4", "0.83"]  # float 3.0 -> "3", 0.83 kept
    math500 = load_dataset("math500", FIX / "math500.jsonl", validate=False)
    assert math500[0].id == "test/prealgebra/1001.json" and math500[0].metadata["level"] == 1
    assert math500[2].answers == ["\\left( 3, \\frac{\\pi}{2} \\right)"]
    minerva = load_dataset("minervamath", FIX / "minervamath.jsonl", validate=False)
    assert [e.id for e in minerva] == ["minervamath-0000", "minervamath-0001"] and minerva[0].answers == [
        "10"
    ]
    oly = load_dataset("olympiadbench", FIX / "olympiadbench.json", validate=False)
    assert oly[0].answers == ["$7$"] and oly[0].prompt.startswith("Find the smallest")
    assert oly[1].prompt.startswith("Let $a_1 = 1$") and oly[1].prompt.endswith("Compute $a_5$.")
    assert all(e.task == "math" and e.split == "test" and e.choices == [] for e in aime + amc + math500 + oly)


def test_multiple_choice_loaders_give_letters_into_choices() -> None:
    mmlu = load_dataset("mmlu_pro", FIX / "mmlu_pro.parquet", validate=False)
    assert (
        len(mmlu[0].choices) == 10
        and mmlu[0].answers == ["C"]
        and mmlu[0].choices[mmlu[0].answer_index] == "37"
    )
    assert mmlu[1].choices[mmlu[1].answer_index] == "newton"
    arc = load_dataset("arc_challenge", FIX / "arc_challenge.jsonl", validate=False)  # AI2's nested form
    assert [e.choices[e.answer_index] for e in arc] == ["evaporation", "balance"]
    assert arc[1].answers == ["A"] and arc[1].metadata["original_labels"] == ["1", "2", "3", "4"]
    arc_hf = load_dataset("arc_challenge", FIX / "arc_challenge.parquet", validate=False)
    assert arc_hf[0].choices[arc_hf[0].answer_index] == "luster" and arc_hf[0].metadata == {}
    gpqa = load_dataset("gpqa_diamond", FIX / "gpqa_diamond.csv", validate=False)
    assert [e.choices[e.answer_index] for e in gpqa] == ["photon", "+7", "mitochondrion"]  # stripped
    assert sorted(gpqa[1].choices) == sorted(["+7", "+5", "+4", "+2"])
    assert gpqa[2].prompt.endswith("(consider eukaryotic cells)")  # multi-line CSV cell
    again = load_dataset("gpqa_diamond", FIX / "gpqa_diamond.csv", validate=False)
    assert [e.choices for e in again] == [e.choices for e in gpqa]  # option order seeded by record id


def test_qa_loaders_keep_aliases_and_evidence() -> None:
    hotpot = load_dataset("hotpotqa", FIX / "hotpotqa.json", validate=False)
    assert [e.answers for e in hotpot] == [["yes"], ["Oslo"]] and hotpot[0].split == "train"
    assert hotpot[1].metadata["supporting_facts"] == [["Winter Lanterns", 0], ["Ivar Lund", 1]]
    hotpot_hf = load_dataset("hotpotqa", FIX / "hotpotqa.parquet", validate=False)  # dict-of-lists form
    assert hotpot_hf[0] == hotpot[0]
    two = load_dataset("2wikimultihopqa", FIX / "2wikimultihopqa.json", validate=False)
    assert two[0].answers == ["Karl Vinter"] and two[0].metadata["evidences"][1] == [
        "Edda Vinter",
        "father",
        "Karl Vinter",
    ]
    mus = load_dataset("musique", FIX / "musique.jsonl", validate=False)
    assert mus[0].answers == ["Milbrook", "Milbrook City"] and [e.metadata["hops"] for e in mus] == [2, 3]
    bam = load_dataset("bamboogle", FIX / "bamboogle.parquet", validate=False)
    assert [(e.id, e.answers) for e in bam] == [
        ("bamboogle-0000", ["Ulysses S. Grant"]),
        ("bamboogle-0001", ["Paris"]),
    ]
    assert all(e.task == "qa" and e.choices == [] for e in hotpot + two + mus + bam)


def test_bfcl_loader_joins_ground_truth_and_keeps_backend_state() -> None:
    rows = load_dataset("bfcl", FIX / "bfcl" / "BFCL_v4_multi_turn_miss_func.json", validate=False)
    first = rows[0]
    assert (
        first.id == "multi_turn_miss_func_3"
        and first.task == "fc"
        and first.source == "bfcl_v4_multi_turn_miss_func"
    )
    assert first.prompt == "Go into the 'notes' folder and list what is there."
    assert first.metadata["turns"][2] == [] and first.metadata["missed_function"] == {"2": ["sort"]}
    assert first.metadata["ground_truth"][0] == ["cd(folder='notes')", "ls()"]
    assert [json.loads(a) for a in first.answers] == first.metadata["ground_truth"]
    assert first.metadata["initial_config"]["GorillaFileSystem"]["root"]["alex"]["type"] == "directory"
    assert [r.split for r in rows] == [bfcl.bfcl_split(r.id) for r in rows]
    assert (
        load_dataset(
            "bfcl", FIX / "bfcl" / "BFCL_v4_multi_turn_miss_func.json", split="test", validate=False
        )[0].split
        == "test"
    )


def test_loader_errors_name_the_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown dataset 'nq'"):
        load_dataset("nq", FIX / "math500.jsonl")
    bad = tmp_path / "math500.jsonl"
    bad.write_text('{"problem": "What is 1+1?", "unique_id": "test/x/1.json"}\n')
    with pytest.raises(ValueError, match=r"math500.jsonl: row 1: no answer field"):
        load_dataset("math500", bad)
    bad.write_text('{"problem": "What is 1+1?"\n')
    with pytest.raises(DataValidationError, match=r"(?s)math500.jsonl \(while reading\).*valid JSON: line 1"):
        read_records(bad)
    with pytest.raises(ValueError, match="unsupported format '.txt'"):
        read_records(_touch(tmp_path / "a.txt"))


def _touch(path: Path) -> Path:
    path.write_text("x")
    return path


def test_fixture_datasets_pass_their_suites() -> None:
    math_rows = [
        e
        for name, f in [
            ("deepscaler", "deepscaler.json"),
            ("aime24", "aime24.parquet"),
            ("amc23", "amc23.jsonl"),
            ("math500", "math500.jsonl"),
            ("minervamath", "minervamath.jsonl"),
            ("olympiadbench", "olympiadbench.json"),
        ]
        for e in load_dataset(name, FIX / f, validate=False)
    ]
    mc_rows = [
        e
        for name, f in [
            ("mmlu_pro", "mmlu_pro.parquet"),
            ("arc_challenge", "arc_challenge.jsonl"),
            ("arc_challenge", "arc_challenge.parquet"),
            ("gpqa_diamond", "gpqa_diamond.csv"),
        ]
        for e in load_dataset(name, FIX / f, validate=False)
    ]
    qa_rows = [
        e
        for name, f in [
            ("hotpotqa", "hotpotqa.json"),
            ("2wikimultihopqa", "2wikimultihopqa.json"),
            ("musique", "musique.jsonl"),
            ("bamboogle", "bamboogle.parquet"),
        ]
        for e in load_dataset(name, FIX / f, validate=False)
    ]
    # every fixture record is loaded (a suite passes an empty list too), under its task and source
    assert Counter(e.source for e in math_rows) == {"deepscaler": 3, "aime24": 2, "amc23": 3, "math500": 3,
                                                    "minervamath": 2, "olympiadbench": 2}
    assert Counter(e.source for e in mc_rows) == {"mmlu_pro": 2, "arc_challenge": 3, "gpqa_diamond": 3}
    assert Counter(e.source for e in qa_rows) == {"hotpotqa": 2, "2wikimultihopqa": 2, "musique": 2, "bamboogle": 2}
    assert {e.task for e in math_rows + mc_rows} == {"math"} and {e.task for e in qa_rows} == {"qa"}
    assert all(e.prompt.strip() and e.answers for e in math_rows + mc_rows + qa_rows)
    assert all(len(e.choices) >= 2 for e in mc_rows) and not any(e.choices for e in math_rows + qa_rows)
    known = next(e for e in math_rows if e.id == "aime24-60")
    assert (known.split, known.answers, known.metadata["year"]) == ("test", ["500"], "2024")
    validate_examples(math_rows, "math fixtures", "math")
    validate_examples(mc_rows, "mc fixtures", "mc")
    validate_examples(qa_rows, "qa fixtures", "qa")
    fc_rows = load_dataset("bfcl", FIX / "bfcl" / "BFCL_v4_multi_turn_miss_func.json")  # validates by default
    assert [(e.id, e.task, e.split) for e in fc_rows] == [("multi_turn_miss_func_3", "fc", "train"),
                                                        ("multi_turn_miss_func_150", "fc", "train")]


# ------------------------------------------------------------------------------------- validation
def test_gx_rejects_a_corrupted_file_naming_rows_and_file(generated: Path, tmp_path: Path) -> None:
    rows = _jsonl(generated / "math" / "test.jsonl")
    rows[2]["answers"] = [" "]  # line 3: blank answer
    rows[4]["split"] = "dev"  # line 5: unknown split
    rows[6]["id"] = rows[0]["id"]  # lines 1 and 7: duplicate id
    del rows[8]["prompt"]  # line 9: missing prompt
    rows[10]["extra"] = 1  # line 11: unknown key
    rows[12]["metadata"] = "not an object"  # line 13
    bad = tmp_path / "corrupt_math.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(DataValidationError) as info:
        load_validated(bad)
    err = info.value
    message = str(err)
    assert str(bad) in message and err.kind == "math"
    assert sorted({r.line for r in err.bad_rows}) == [1, 3, 5, 7, 9, 11, 13]
    by_line = {r.line: r.rule for r in err.bad_rows}
    assert by_line[3] == "no answer is blank" and by_line[5].startswith("split is one of")
    assert by_line[9] == "prompt is present and not blank" and by_line[11] == "no unknown keys"
    assert by_line[13] == "metadata is a JSON object" and by_line[7] == "id is unique"
    for line in (3, 5, 9, 11, 13):
        assert f"line {line} (id '{rows[line - 1]['id']}')" in message
    assert isinstance(err, ValueError)


def test_gx_multiple_choice_and_fc_rules(generated: Path, tmp_path: Path) -> None:
    mc = [
        Example(f"q{i}", "math", "mmlu_pro", "test", f"Question {i}?", [letter], ["a", "b", "c"])
        for i, letter in enumerate(["A", "C", "D", "c"])
    ]
    with pytest.raises(DataValidationError) as info:
        validate_examples(mc, "mc.jsonl")
    assert info.value.kind == "mc"
    assert {(r.id, r.rule) for r in info.value.bad_rows} == {
        ("q2", "answer letter names one of the choices"),
        ("q3", "answer is a letter A-J"),
    }

    rows = _jsonl(generated / "fc" / "test.jsonl")[:4]
    rows[1]["metadata"]["ground_truth"] = rows[1]["metadata"]["ground_truth"][:-1]
    rows[3]["metadata"]["category"] = "multi_turn_composite"
    path = tmp_path / "fc.jsonl"
    path.write_text("".join(jsonl_line(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(DataValidationError) as info:
        load_validated(path)
    assert {(r.line, r.rule) for r in info.value.bad_rows} == {
        (2, "one ground-truth entry per turn"),
        (4, f"metadata.category is one of {list(bfcl.CATEGORIES)}"),
    }


def test_invalid_published_rows_stop_the_loader(tmp_path: Path) -> None:
    path = tmp_path / "math500.jsonl"
    path.write_text(
        json.dumps({"problem": "1+1?", "answer": "2", "unique_id": "test/a/1.json"})
        + "\n"
        + json.dumps({"problem": "2+2?", "answer": "", "unique_id": "test/a/2.json"})
        + "\n"
    )
    with pytest.raises(DataValidationError, match=r"(?s)math500.jsonl.*line 2 \(id 'test/a/2.json'\)"):
        load_dataset("math500", path)
    path.write_text('{"id": "a"}\nnot json\n')
    with pytest.raises(DataValidationError, match=r"line 2 \(id None\)"):
        load_validated(path)


def test_generated_files_pass_their_suites(generated: Path) -> None:
    assert validate_dir(generated) == {
        "fc/test.jsonl": "fc",
        "fc/train.jsonl": "fc",
        "math/test.jsonl": "math",
        "math/train.jsonl": "math",
        "qa/corpus.jsonl": "corpus",
        "qa/test.jsonl": "qa",
        "qa/train.jsonl": "qa",
    }


# ------------------------------------------------------------------------------------- generators
def test_generation_matches_the_hash_in_data_dvc(generated: Path) -> None:
    assert dvc_dir_md5(generated) == dvc_recorded_md5(REPO / "data.dvc")


def test_generation_is_byte_for_byte_repeatable(generated: Path, tmp_path: Path) -> None:
    again = tmp_path / "data"
    counts = generate(again)
    files = sorted(str(p.relative_to(generated)) for p in generated.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(again)) for p in again.rglob("*") if p.is_file())
    match, mismatch, errors = filecmp.cmpfiles(generated, again, files, shallow=False)
    assert mismatch == [] and errors == [] and len(match) == len(files) == 9
    assert counts == {
        "math/train.jsonl": 400,
        "math/test.jsonl": 100,
        "qa/train.jsonl": 400,
        "qa/test.jsonl": 100,
        "qa/corpus.jsonl": 204,
        "qa/kb.json": 120,
        "fc/train.jsonl": 192,
        "fc/test.jsonl": 48,
    }


def test_verify_cli_accepts_regenerated_data_and_flags_a_wrong_hash(tmp_path: Path) -> None:
    out = tmp_path / "data"
    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        assert main(["--verify", "--out", str(out), "--dvc-file", str(REPO / "data.dvc")]) == 0
    assert stdout.getvalue().startswith("OK: ")
    wrong = tmp_path / "wrong.dvc"
    wrong.write_text(
        (REPO / "data.dvc").read_text().replace(dvc_recorded_md5(REPO / "data.dvc"), "0" * 32 + ".dir")
    )
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["--verify", "--out", str(out), "--dvc-file", str(wrong)]) == 1


def test_generate_never_replaces_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="without MANIFEST.json"):
        generate(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_math_problems_are_exact_split_apart_and_solved_by_their_code(generated: Path) -> None:
    train, test = _jsonl(generated / "math" / "train.jsonl"), _jsonl(generated / "math" / "test.jsonl")
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert Counter(r["metadata"]["template"] for r in train) == {t: 40 for t in arith.TEMPLATES}
    assert {r["metadata"]["answer_kind"] for r in train} == {"integer", "fraction"}
    for row in test:  # each example's program prints its answer
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(row["metadata"]["solution_code"], {})  # noqa: S102 - our own generated code
        assert out.getvalue().strip() == row["answers"][0], row["id"]
    fractions = [r["answers"][0] for r in train if r["metadata"]["answer_kind"] == "fraction"]
    assert all("/" in a and int(a.split("/")[1]) > 1 for a in fractions)


def test_kb_questions_follow_their_paths_through_the_corpus(generated: Path) -> None:
    entities = {e["id"]: e for e in json.loads((generated / "qa" / "kb.json").read_text())["entities"]}
    passages = {p["id"]: p["text"] for p in _jsonl(generated / "qa" / "corpus.jsonl")}
    rows = _jsonl(generated / "qa" / "train.jsonl") + _jsonl(generated / "qa" / "test.jsonl")
    assert Counter(r["metadata"]["hops"] for r in rows) == {2: 168, 3: 166, 4: 166}
    for row in rows:
        path = row["metadata"]["path"]
        assert row["metadata"]["supporting_passages"] == [step["passage"] for step in path]
        assert len({step["entity_id"] for step in path}) == len(path)  # no entity twice
        for step, nxt in zip(path, path[1:] + [None], strict=True):
            entity = entities[step["entity_id"]]
            value = entity["attrs"][step["relation"]]
            target = entities[value]["name"] if step["relation"] in kb.RELATIONS[entity["kind"]] else value
            if nxt is not None:
                assert nxt["entity_id"] == value
            else:
                assert str(target) == row["answers"][0]
            text = passages[step["passage"]]
            assert step["entity"] in text
            assert (f"{target:,}" if step["relation"] == "population" else str(target)) in text


def test_bfcl_split_is_per_scenario_exact_and_pinned(generated: Path) -> None:
    test_scenarios = [s for s in range(bfcl.N_SCENARIOS) if bfcl.bfcl_split(f"multi_turn_base_{s}") == "test"]
    assert len(test_scenarios) == 40 and test_scenarios[:6] == [4, 11, 16, 22, 34, 36]
    for s in range(bfcl.N_SCENARIOS):
        assert len({bfcl.bfcl_split(f"{c}_{s}") for c in bfcl.CATEGORIES}) == 1
    small, large = bfcl.subset_scenarios(60), bfcl.subset_scenarios(100)
    assert set(small) <= set(large) and len(small) == 60
    assert sum(bfcl.bfcl_split(f"multi_turn_base_{s}") == "test" for s in small) == 12
    train, test = _jsonl(generated / "fc" / "train.jsonl"), _jsonl(generated / "fc" / "test.jsonl")
    assert not {r["metadata"]["scenario"] for r in train} & {r["metadata"]["scenario"] for r in test}
    assert Counter(r["metadata"]["category"] for r in test) == {c: 12 for c in bfcl.CATEGORIES}
    assert Counter(r["metadata"]["category"] for r in train) == {c: 48 for c in bfcl.CATEGORIES}
    with pytest.raises(ValueError, match="not a multi-turn id"):
        bfcl.bfcl_split("simple_python_3")


def test_hash_draws_are_pinned_across_versions() -> None:
    rng = HashRng("pin")
    assert [rng.randint(0, 10**6) for _ in range(3)] == [82299, 632745, 696468]
    assert hash_unit("abc") == pytest.approx(0.7283949105904022, abs=0) and hash_split("abc") == "train"
    assert sorted(HashRng("s").shuffled(range(10))) == list(range(10))
    with pytest.raises(ValueError, match="test_fraction"):
        hash_split("abc", 1.5)
