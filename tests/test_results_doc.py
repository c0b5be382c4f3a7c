"""docs/results.md is rendered from the committed records: rendering again finds the committed page,
and every figure in it moves when its record does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import report

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_page_is_what_the_records_render():
    assert (ROOT / "docs" / "results.md").read_text() == report.render(), \
        "docs/results.md differs from its records: run python -m bench.report"


def test_every_section_names_records_that_exist():
    for section in report.SECTIONS:
        assert (ROOT / section.records).is_file() or section.pending, section.records


def test_a_section_waiting_for_its_record_names_the_command_that_writes_it(tmp_path):
    waiting = [s for s in report.SECTIONS if s.pending]
    assert waiting  # the SmolLM2 pipeline's, until its record is committed
    for section in waiting:
        lines = report.render_section(section, tmp_path)  # no record under tmp_path
        assert lines[0] == f"## {section.title}"
        assert any(section.pending in line and section.records in line for line in lines)


def test_a_changed_record_changes_the_page(tmp_path):
    section = next(s for s in report.SECTIONS if s.records == "bench/results/testbed.json")
    (tmp_path / "bench" / "results").mkdir(parents=True)
    record = json.loads((ROOT / section.records).read_text())
    shutil.copy(ROOT / section.records, tmp_path / section.records)
    before = "\n".join(report.render_section(section, tmp_path))
    assert "| pool | 128 | 46 |" in before
    record["spread"]["pool"]["histogram"][0] = 45
    (tmp_path / section.records).write_text(json.dumps(record))
    after = "\n".join(report.render_section(section, tmp_path))
    assert "| pool | 127 | 45 |" in after and "| pool | 128 | 46 |" not in after


def test_a_missing_record_is_named(tmp_path):
    with pytest.raises(SystemExit, match="bench/results/testbed.json"):
        report.render_section(next(s for s in report.SECTIONS if s.records == "bench/results/testbed.json"), tmp_path)


@pytest.mark.parametrize(("targets", "line"), [
    ({"a": True}, "- a: **PASS**"),
    ({"a": "MISS 0.1 vs 0.2"}, "- a: **MISS** 0.1 vs 0.2"),
    ({"a": {"value": 3.0, "target": "<= 4", "met": False, "reason": "why"}}, "- a (target <= 4): **MISS** 3.000; why"),
    ({"x": {"checks": {"c": True}}}, "- x: c: **PASS**"),
])
def test_verdicts_in_each_form_a_benchmark_writes(targets, line):
    assert report.verdict_lines(targets) == [line]


def test_check_mode_reports_a_stale_page(tmp_path, capsys):
    page = tmp_path / "results.md"
    page.write_text("stale\n")
    assert report.main(["--check", "--out", str(page)]) == 1
    assert "differs from the records" in capsys.readouterr().out
    assert report.main(["--out", str(page)]) == 0
    assert report.main(["--check", "--out", str(page)]) == 0
