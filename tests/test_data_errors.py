"""Data errors that name their input: undecodable bytes, oversized rows, and the command lines that
print the report (file, rules, rows) without a traceback and exit with status 2.

Every bad file is written to tmp_path here; the exit statuses are those of real subprocesses.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trace_core.data.bfcl import load_bfcl_file
from trace_core.data.loaders import load_dataset, read_records
from trace_core.data.reading import READ_STAGE, ReadConfig, read_json_lines
from trace_core.data.validation import DataValidationError, load_validated

pytestmark = pytest.mark.faults  # selected by `make faults`; the tests with `fault` are its injections
FAULT_AREA = "bad data"

REPO = Path(__file__).resolve().parents[1]
UTF8_RULE = "the line is valid UTF-8"
SIZE_RULE = "a row is at most {} bytes"


def _row(i: int, **extra: object) -> dict:
    row = {"id": f"m{i}", "task": "math", "source": "unit", "split": "train", "prompt": f"What is {i}+1?",
           "answers": [str(i + 1)], "choices": [], "metadata": {}}
    row.update(extra)
    return row


def _write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def _line(row: dict) -> bytes:
    return json.dumps(row, ensure_ascii=False).encode()


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


# --- undecodable bytes -----------------------------------------------------------------------------


def test_invalid_utf8_names_the_file_line_and_byte(fault, tmp_path: Path) -> None:
    bad = _write_lines(tmp_path / "latin1.jsonl", [
        _line(_row(0)),
        _line(_row(1, prompt="caf\u00e9?")).replace("é".encode(), b"\xe9"),  # Latin-1, not UTF-8
        _line(_row(2)),
        b'{"id": "m3", "prompt": "\xff\xfe"}',
    ])
    with pytest.raises(DataValidationError) as info:
        load_validated(bad)
    err = info.value
    assert err.kind == READ_STAGE and [(r.line, r.rule) for r in err.bad_rows] == [(2, UTF8_RULE), (4, UTF8_RULE)]
    message = str(err)
    assert message.startswith(f"invalid data in {bad} (while reading): 2 bad row(s)")
    column = _line(_row(1, prompt="caf?")).index(b"caf") + 4
    assert f"line 2 (id None) [byte 0xe9 at column {column}]" in message
    assert "line 4 (id None) [byte 0xff at column 25]" in message  # after '{"id": "m3", "prompt": "'
    assert not isinstance(err.__cause__, UnicodeDecodeError)  # no bare decode error underneath


@pytest.mark.parametrize("suffix", [".csv", ".json", ".jsonl"])
def test_published_formats_name_the_undecodable_line(fault, tmp_path: Path, suffix: str) -> None:
    good = {".csv": b"Question,Answer", ".json": b"[", ".jsonl": b'{"Question": "q", "Answer": "a"}'}[suffix]
    bad = _write_lines(tmp_path / f"bamboogle{suffix}", [good, b'  "Who was \x80?"'])  # byte 12 of line 2
    with pytest.raises(DataValidationError, match=rf"(?s){bad.name} \(while reading\).*line 2 \(id None\) "
                                                  r"\[byte 0x80 at column 12\]"):
        read_records(bad)


def test_bfcl_files_name_the_undecodable_line(fault, tmp_path: Path) -> None:
    questions = _write_lines(tmp_path / "BFCL_v4_multi_turn_base.json", [b'{"id": "multi_turn_base_0\xc3"}'])
    with pytest.raises(DataValidationError,
                       match=r"(?s)BFCL_v4_multi_turn_base.json \(while reading\).*line 1 \(id None\) \[byte 0xc3"):
        load_bfcl_file(questions)


# --- row size --------------------------------------------------------------------------------------


def test_a_20_mb_metadata_field_is_rejected_by_default(fault, tmp_path: Path) -> None:
    huge = _row(1, metadata={"notes": "x" * (20 << 20)})
    path = _write_lines(tmp_path / "huge.jsonl", [_line(_row(0)), _line(huge), _line(_row(2))])
    with pytest.raises(DataValidationError) as info:
        load_validated(path)
    limit = ReadConfig().max_row_bytes
    assert limit == 1 << 20
    (bad,) = info.value.bad_rows
    assert (bad.line, bad.id, bad.rule) == (2, "m1", SIZE_RULE.format(limit))
    assert f"line 2 (id 'm1') [{len(_line(huge))} bytes]" in str(info.value)


def test_the_row_limit_is_configurable(fault, tmp_path: Path) -> None:
    rows = [_row(0), _row(1, metadata={"notes": "y" * 600}), _row(2)]
    path = _write_lines(tmp_path / "rows.jsonl", [_line(r) for r in rows])
    records, lines = read_json_lines(path)  # the default takes them all
    assert [r["id"] for r in records] == ["m0", "m1", "m2"] and lines == [1, 2, 3]
    with pytest.raises(DataValidationError) as info:
        read_json_lines(path, ReadConfig(max_row_bytes=500))
    assert [(r.line, r.id) for r in info.value.bad_rows] == [(2, "m1")]
    for value in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="max_row_bytes"):
            ReadConfig(max_row_bytes=value)  # type: ignore[arg-type]


def test_rows_of_csv_and_parquet_files_are_measured_too(fault, tmp_path: Path) -> None:
    path = tmp_path / "bamboogle.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerows([["Question", "Answer"], ["short?", "yes"], ["long " * 300 + "?", "no"]])
    with pytest.raises(DataValidationError, match=r"a row is at most 1000 bytes: line 2 \(id None\) \[row 2: "):
        load_dataset("bamboogle", path, read=ReadConfig(max_row_bytes=1000), validate=False)
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "bamboogle.parquet"
    pq.write_table(pa.table({"Question": ["q" * 2000, "ok?"], "Answer": ["a", "b"]}), parquet)
    with pytest.raises(DataValidationError, match=r"line 1 \(id None\) \[row 1: "):
        read_records(parquet, ReadConfig(max_row_bytes=1000))


def test_every_bad_line_of_a_file_is_reported_at_once(fault, tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "mixed.jsonl", [
        _line(_row(0)),
        b'{"id": "m1", "prompt": "\xc0"}',
        b'{"id": "m2", "prompt": ',
        b"",
        _line(_row(4, metadata={"blob": "z" * 2000})),
        b"[" * 5000 + b"]" * 5000,  # nested past the JSON decoder's recursion limit
    ])
    with pytest.raises(DataValidationError) as info:
        load_validated(path, read=ReadConfig(max_row_bytes=1500))
    rules = {r.line: r.rule for r in info.value.bad_rows}
    assert rules == {2: UTF8_RULE, 3: "the line is valid JSON", 5: SIZE_RULE.format(1500), 6: "the line is valid JSON"}
    assert "4 bad row(s)" in str(info.value)


# --- command lines ---------------------------------------------------------------------------------


def test_validation_cli_prints_the_report_and_exits_2(fault, tmp_path: Path) -> None:
    good = _write_lines(tmp_path / "good.jsonl", [_line(_row(i)) for i in range(3)])
    undecodable = _write_lines(tmp_path / "undecodable.jsonl", [_line(_row(0)), b'{"id": "\xff"}'])
    broken = _write_lines(tmp_path / "broken.jsonl", [_line(_row(0)), _line(_row(1, answers=[" "]))])
    result = _run("-m", "trace_core.data.validation", str(good), str(undecodable), str(broken))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == f"valid: {good} (3 examples)\n"
    assert f"invalid data in {undecodable} (while reading): 1 bad row(s)" in result.stderr
    assert "  - the line is valid UTF-8: line 2 (id None) [byte 0xff at column 9]" in result.stderr
    assert f"invalid data in {broken} (suite 'math'): 1 bad row(s), 0 table rule(s) broken" in result.stderr
    assert "  - no answer is blank: line 2 (id 'm1')" in result.stderr


def test_validation_cli_row_limit_and_bad_arguments(fault, tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "rows.jsonl", [_line(_row(0)), _line(_row(1, metadata={"n": "w" * 400}))])
    result = _run("-m", "trace_core.data.validation", "--max-row-bytes", "300", str(path), str(tmp_path / "nope.jsonl"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "  - a row is at most 300 bytes: line 2 (id 'm1')" in result.stderr
    assert f"cannot read {tmp_path / 'nope.jsonl'}: No such file or directory" in result.stderr
    zero = _run("-m", "trace_core.data.validation", "--max-row-bytes", "0", str(path))
    assert zero.returncode == 2 and "max_row_bytes must be a whole number of bytes >= 1" in zero.stderr


def test_generate_cli_reports_invalid_output_and_exits_2(fault, tmp_path: Path) -> None:
    out = tmp_path / "data"
    result = _run("-m", "trace_core.data.generate", "--out", str(out), "--max-row-bytes", "700")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"invalid data in {out / 'fc' / 'test.jsonl'} (while reading)" in result.stderr
    assert "  - a row is at most 700 bytes: line 1 (id 'multi_turn_base_" in result.stderr


def test_train_cli_reports_invalid_training_data_and_exits_2(fault, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    from trace_core.cli import main

    bad = _write_lines(tmp_path / "train.jsonl", [_line(_row(0)), b'{"id": "m1", "prompt": "\xfe"}'])
    model = tmp_path / "model"  # the paths are checked first: a model directory's config is enough to get here
    model.mkdir()
    (model / "config.json").write_text("{}")
    status = main(["train", "task.family=math", f"task.train_file={bad}", f"output_dir={tmp_path / 'run'}",
                   f"policy_model={model}", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert err.startswith(f"trace-rl: invalid data in {bad} (while reading)")
    assert "line 2 (id None) [byte 0xfe at column 25]" in err
