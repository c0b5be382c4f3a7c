"""bench/real_learning: a run's held-out gain paired by question, and the committed tables
recomputed from their committed records alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from bench import real_learning as rl

REPO = Path(__file__).resolve().parents[1]
COMMITTED = sorted(p.parent for p in (REPO / "bench" / "results").glob("real_learning*/table.json"))


def _record(start: dict[str, int], end: dict[str, int]) -> dict:
    return {"format": rl.RECORD_FORMAT, "method": "grpo", "seed": 0, "commit": "abc", "dirty": False,
            "settings": {"steps": 2}, "wall_s": 10.0,
            "steps": {"rollouts": [8.0, 8.0], "generated_tokens": [100.0, 140.0], "effective_ratio": [0.5, 0.25],
                      "mixed_groups": [1.0, 0.5], "reward": [0.4, 0.5], "step_wall_s": [4.0, 5.0]},
            "heldout": [{"step": 0, "samples": 4, "successes": start}, {"step": 2, "samples": 4, "successes": end}]}


def test_a_runs_gain_is_paired_by_question():
    row = rl.summarise(_record({"a": 1, "b": 2, "c": 0}, {"a": 3, "b": 2, "c": 1}))
    # per question: +2/4, 0, +1/4 -> mean 0.25, SE = std([0.5, 0, 0.25], ddof=1)/sqrt(3)
    assert row["gain"] == pytest.approx(0.25)
    assert row["gain_se"] == pytest.approx(0.25 / 3 ** 0.5)
    assert row["gain_in_se"] == pytest.approx(3 ** 0.5)
    assert row["start"] == pytest.approx(3 / 12) and row["end"] == pytest.approx(6 / 12)
    # the step figures weighted by each step's rollouts, and the curve on cumulative rollouts
    assert row["effective_ratio"] == pytest.approx(0.375)
    assert row["rollouts"] == 16.0 and row["generated_tokens"] == 240.0
    assert [c["rollouts"] for c in row["curve"]] == [0.0, 16.0]


def test_the_reading_says_where_the_rollouts_went():
    record = _record({"a": 1}, {"a": 2})
    # step 1: 4 bare rollouts per selected prompt of 4 in all (no continuation); step 2: 2 of 4
    record["steps"].update({"mean_m_selected": [4.0, 2.0], "mean_rollouts_selected": [4.0, 4.0],
                            "expanded_anchors": [0.0, 4.0], "mixed_anchors": [0.0, 1.0]})
    row = rl.summarise(record)
    assert row["continuation_share"] == pytest.approx(0.25)  # (0·8 + 0.5·8) / 16
    assert row["prefix_effective_ratio"] == pytest.approx(0.25)


def test_questions_measured_only_once_are_refused():
    with pytest.raises(ValueError, match="same questions"):
        rl.summarise(_record({"a": 1, "b": 2}, {"a": 3, "c": 2}))


def test_every_committed_table_is_recomputed_from_its_records(tmp_path):
    assert COMMITTED, "no committed bench/results/real_learning*/table.json"
    for folder in COMMITTED:
        copy = tmp_path / folder.name
        shutil.copytree(folder / "runs", copy / "runs")
        rl.main(["table", "--records", str(copy), "--no-plot"])
        recomputed = json.loads((copy / "table.json").read_text())
        committed = json.loads((folder / "table.json").read_text())
        assert recomputed == committed, (
            f"{folder.name}: rebuild it with python -m bench.real_learning table --records {folder.relative_to(REPO)} "
            "(its reading sits beside the testbed benchmark's, read from bench/results/learning)")


@pytest.mark.parametrize("rank", [0, 8])
def test_adapters_are_a_setting_of_the_run_only_when_asked_for(tmp_path, rank):
    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig

    args = rl.parse_args(["run", "--lora-rank", str(rank), "--warm", str(tmp_path)])
    settings = rl.run_settings("grpo", 0, args, {"weights_digest": "d"})
    assert ("lora_rank" in settings) == bool(rank)  # full fine-tuning's records keep their settings
    config = load_config(TrainConfig, None, rl.overrides(args, settings, tmp_path / "out"))
    assert (config.policy.lora is None) if not rank else (config.policy.lora.rank, config.policy.lora.alpha) == (8, 16)


def _checkpointed_run(out: Path, settings: dict, step: int) -> None:
    """A run folder as the trainer leaves it after ``step``: two checkpoints, the figures, a tree file."""
    for s in (step - 1, step):
        ckpt = out / "checkpoints" / f"step_{s:06d}"
        (ckpt / "policy" / "policy").mkdir(parents=True)
        # what DeepSpeed writes with adapters: the trained weights and a tied frozen one it let through
        torch.save({"param_shapes": [{"a.lora_A": (2, 3)}], "module": {"a.lora_A": torch.full((2, 3), float(s)),
                                                                        "lm_head.weight": torch.zeros(50, 3)}},
                   ckpt / "policy" / "policy" / "mp_rank_00_model_states.pt")
        (ckpt / "trainer_state.json").write_text(json.dumps({"step": s}))
        (ckpt / "policy" / "zero_to_fp32.py").write_text("# DeepSpeed's conversion script\n")
    (out / "checkpoints" / "latest").write_text(f"step_{step:06d}")
    (out / "heldout").mkdir()
    (out / "heldout" / "step00001.json").write_text("{}")
    (out / "trees").mkdir()
    (out / "trees" / "step00001.jsonl.gz").write_bytes(b"x" * 32)
    for name in ("step_history.jsonl", "mlflow.db", "run_identity.json"):
        (out / name).write_text(name)


def test_an_unfinished_run_is_carried_to_the_records_and_resumed_from_them_on_another_machine(tmp_path, capsys):
    settings = {"method": "grpo", "seed": 0, "steps": 30}
    work, records = tmp_path / "work", tmp_path / "records"
    out = work / "grpo-seed0"
    first = rl.claim_run(out, rl.Provenance("c1", False), settings)
    assert [{k: v for k, v in x.items() if k != "started"} for x in first] == [
        {"commit": "c1", "dirty": False, "from_step": 0}]
    _checkpointed_run(out, settings, step=5)
    rl.cmd_carry(rl.build_parser().parse_args(["carry", "--work", str(work), "--records", str(records)]))
    assert "step 5 of 30 carried" in capsys.readouterr().out
    carried = records / rl.CARRY_DIR / "grpo-seed0"
    held = {p.relative_to(carried).as_posix() for p in carried.rglob("*") if p.is_file()}
    assert "checkpoints/step_000005/policy/policy/mp_rank_00_model_states.pt" in held
    assert not any(h.startswith(("checkpoints/step_000004", "trees/")) for h in held)  # the last checkpoint only
    assert not any(h.endswith("zero_to_fp32.py") for h in held)  # DeepSpeed's script: not for a commit
    assert {"checkpoints/latest", "heldout/step00001.json", "mlflow.db", "step_history.jsonl",
            rl.SETTINGS_FILE, rl.SITTINGS_FILE} <= held
    module = torch.load(carried / "checkpoints/step_000005/policy/policy/mp_rank_00_model_states.pt")["module"]
    assert list(module) == ["a.lora_A"] and module["a.lora_A"].eq(5.0).all()  # the frozen weight left behind
    # another machine: no work folder; the next sitting restores the carried state and resumes it
    shutil.rmtree(work)
    rl.restore_carried(carried, out, settings)
    sittings = rl.claim_run(out, rl.Provenance("c2", True), settings)
    assert rl.latest_step(out) == 5 and sittings[0]["to_step"] == 5 and sittings[0]["wall_s"] >= 0
    assert {k: sittings[-1][k] for k in ("commit", "dirty", "from_step")} == {"commit": "c2", "dirty": True,
                                                                            "from_step": 5}
    # a work folder ahead of the carried state keeps its own; other settings never take it
    ahead = out / "checkpoints" / "step_000007"
    ahead.mkdir()
    (ahead / "trainer_state.json").write_text(json.dumps({"step": 7}))
    (out / "checkpoints" / "latest").write_text(ahead.name)
    rl.restore_carried(carried, out, settings)
    assert rl.latest_step(out) == 7
    other = tmp_path / "other"
    rl.restore_carried(carried, other, {**settings, "seed": 1})
    assert not other.exists()
    # other settings in the folder: it starts over (a longer run of the same settings goes on instead)
    assert rl.claim_run(out, rl.Provenance("c3", False), {**settings, "seed": 3})[-1]["from_step"] == 0
    assert not (out / "checkpoints").exists()


def test_a_full_fine_tuning_checkpoint_is_too_large_to_carry(tmp_path, monkeypatch):
    out = tmp_path / "grpo-seed0"
    rl.claim_run(out, rl.Provenance("c1", False), {"method": "grpo", "seed": 0, "steps": 30})
    _checkpointed_run(out, {}, step=2)
    monkeypatch.setattr(rl, "CARRY_LIMIT_BYTES", 100)
    with pytest.raises(SystemExit, match="--lora-rank"):
        rl.carry_run(out, tmp_path / "carry")


def test_a_method_that_reads_the_predictor_warms_it_up_on_the_warm_starts_own_split(tmp_path):
    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig

    args = rl.parse_args(["run", "--warm", str(tmp_path), "--warmup-k", "2"])
    grpo = rl.run_settings("grpo", 0, args, {"weights_digest": "d"})
    trace = rl.run_settings("trace", 0, args, {"weights_digest": "d"})
    assert "warmup_k" not in grpo and trace["warmup_k"] == 2  # GRPO's settings (and its resumes) unchanged
    with pytest.raises(SystemExit, match="warmup.jsonl is missing"):
        rl.overrides(args, trace, tmp_path / "out")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "warmup.jsonl").write_text("")
    config = load_config(TrainConfig, None, rl.overrides(args, trace, tmp_path / "out"))
    assert config.predictor_warmup.task_file == str(tmp_path / "tasks" / "warmup.jsonl")
    assert config.predictor_warmup.samples == 2
    assert load_config(TrainConfig, None, rl.overrides(args, grpo, tmp_path / "out")).predictor_warmup.task_file is None


def test_the_policy_updates_micro_batches_are_a_setting_only_off_the_default(tmp_path):
    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig

    for given, named in ((["--micro-batches", "8"], True), ([], False)):
        args = rl.parse_args(["run", "--warm", str(tmp_path), *given])
        settings = rl.run_settings("grpo", 0, args, {"weights_digest": "d"})
        assert ("micro_batches" in settings) == named  # earlier records keep their settings
        config = load_config(TrainConfig, None, rl.overrides(args, settings, tmp_path / "out"))
        assert config.policy.micro_batches == (8 if named else 2)


def test_a_longer_run_of_the_same_settings_goes_on_from_the_shorter_runs_checkpoint(tmp_path, capsys):
    short = {"method": "grpo", "seed": 0, "steps": 30, "lr": 2e-4, "heldout_at": [6, 12, 18, 24, 30]}
    long = {**short, "steps": 60, "heldout_at": rl.measure_steps(60, 10)}
    assert rl.extends(short, long) and not rl.extends(long, short)
    assert not rl.extends(short, {**long, "lr": 4e-4})  # another learning rate is another run
    assert not rl.extends(short, {**long, "heldout_at": [20, 40, 60]})  # the shorter run's points not among them
    out = tmp_path / "work" / "grpo-seed0"
    rl.claim_run(out, rl.Provenance("c1", False), short)
    _checkpointed_run(out, short, step=30)
    sittings = rl.claim_run(out, rl.Provenance("c2", False), long)
    assert "extending its run of 30 steps to 60" in capsys.readouterr().out
    assert rl.latest_step(out) == 30 and [x["from_step"] for x in sittings] == [0, 30]
    held = json.loads((out / rl.SETTINGS_FILE).read_text())
    assert held["settings"] == long and held["extends"] == [short] and held["commit"] == "c1"
    # carried from a finished shorter run, another machine extends it too
    carry = tmp_path / "records" / rl.CARRY_DIR / "grpo-seed0"
    rl.carry_run(out, carry)
    json.loads((carry / rl.SETTINGS_FILE).read_text())  # the carry holds the (extended) settings
    (carry / rl.SETTINGS_FILE).write_text(json.dumps({"commit": "c1", "settings": short}))
    elsewhere = tmp_path / "other" / "grpo-seed0"
    rl.restore_carried(carry, elsewhere, long)
    assert rl.latest_step(elsewhere) == 30
    rl.restore_carried(carry, tmp_path / "third", {**long, "lr": 4e-4})
    assert not (tmp_path / "third").exists()
    # settings that change more than the length start over
    assert rl.claim_run(out, rl.Provenance("c3", False), {**long, "lr": 4e-4})[-1]["from_step"] == 0


def _pilot(tmp_path: Path, end: dict[str, int], lr: float = 2e-4) -> Path:
    pilot = tmp_path / "pilot"
    (pilot / "runs").mkdir(parents=True)
    record = _record({q: 1 for q in end}, end)
    record["settings"] = {"method": "grpo", "seed": 0, "steps": 30, "lr": lr, "roots_M": 16, "expansion_N": 1,
                          "group_size_G": 4, "max_m": 8, "heldout_k": 4, "dtype": "float32",
                          "heldout_at": [6, 12, 18, 24, 30], "policy": "d1g35t", "lora_rank": 8, "curve_k": 2,
                          "micro_batches": 8}
    (pilot / "runs" / "grpo-seed0.json").write_text(json.dumps(record))
    return pilot


def test_a_protocol_is_frozen_only_on_a_measurable_grpo_gain_and_runs_then_follow_it(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "real_policy-lora16.json").write_text(json.dumps({"policy": {"weights_digest": "d1g35t"}}))
    records = tmp_path / "records"
    freeze = ["freeze", "--records", str(records), "--results", str(results)]
    # a gain inside 3 SE is no evidence: nothing is written
    flat = _pilot(tmp_path / "a", {f"q{i}": 1 + (i % 10 == 0) for i in range(30)})  # 1.8 SE
    with pytest.raises(SystemExit, match="does not exceed 3 SE"):
        rl.main([*freeze, "--pilot", str(flat)])
    assert not (records / rl.PROTOCOL_FILE).exists()
    pilot = _pilot(tmp_path / "b", {f"q{i}": 3 + (i % 2) for i in range(30)})
    rl.main([*freeze, "--pilot", str(pilot)])
    protocol = json.loads((records / rl.PROTOCOL_FILE).read_text())
    assert protocol["knobs"] == {"steps": 30, "lr": 2e-4, "roots_M": 16, "expansion_N": 1, "group_size": 4,
                                 "max_m": 8, "dtype": "float32", "lora_rank": 8, "heldout_k": 4, "curve_k": 2,
                                 "micro_batches": 8, "warmup_k": 4, "measurements": 10,
                                 "start": (results / "real_policy-lora16.json").as_posix()}
    assert protocol["evidence"]["runs"][0]["gain_in_se"] > 3
    # a frozen protocol is not changed
    with pytest.raises(SystemExit, match="froze another protocol"):
        rl.main([*freeze, "--pilot", str(_pilot(tmp_path / "c", {f"q{i}": 4 for i in range(30)}, lr=4e-4))])
    # a run in that folder takes every knob from it, and refuses another value
    args = rl.build_parser().parse_args(["run", "--records", str(records), "--methods", "trace", "--lr", "2e-4"])
    rl.resolve_knobs(args)
    assert (args.lr, args.lora_rank, args.measurements, args.micro_batches) == (2e-4, 8, 10, 8)
    with pytest.raises(SystemExit, match=r"refused: --steps 60 \(frozen: 30\); --lr 0.0004 \(frozen: 0.0002\)"):
        rl.resolve_knobs(rl.build_parser().parse_args(["run", "--records", str(records), "--lr", "4e-4",
                                                       "--steps", "60"]))
    # a folder without a protocol takes the defaults
    free = rl.build_parser().parse_args(["run", "--records", str(tmp_path / "free")])
    rl.resolve_knobs(free)
    assert {k: getattr(free, k) for k in rl.KNOBS} == rl.KNOBS
