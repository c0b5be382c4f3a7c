"""The multi-benchmark evaluator: metric arithmetic on hand-computed cases, every task family end to
end through the real executor and environments, MLflow logging against a real server, the CLI.

Three kinds of policy drive the episodes: the shared tiny Qwen3 on the real vLLM engine (random
weights: the loop, the engine batching and the files must hold up, the rewards are all 0), a tiny
policy warm-started here by ``trace_core.warmstart`` (a short SFT: it writes tool calls), and a
scripted policy — a test double of the *engine* only, writing a known right or wrong trajectory
per sample — so every reported number can be checked against a value computed by hand. The
environments (math sandbox, QA retriever, BFCL backends and official checker), the executor and
the evaluator are all real.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from trace_core.envs.fc_env import ground_truth_tool_calls
from trace_core.envs.math_env import MathEnvConfig
from trace_core.envs.qa_env import exact_match, f1_score, normalize_answer
from trace_core.envs.registry import EnvsConfig, example_to_task, make_env_factory
from trace_core.envs.sandbox import SandboxConfig
from trace_core.evaluation import (
    BenchmarkConfig,
    BenchmarkResult,
    EvalConfig,
    EvalEngineSettings,
    EvalResult,
    FamilyAgents,
    comparison_table,
    domain_averages,
    evaluate,
    load_benchmarks,
    mean_pass_at_k,
    pass_at_1_avg,
    pass_at_k,
)
from trace_core.evaluation.__main__ import main
from trace_core.rollout.agent import AgentConfig
from trace_core.rollout.engine import Completion, GenerationRequest, Sample

FIXTURES = Path(__file__).parent / "fixtures" / "data"
DATA = Path(__file__).resolve().parents[1] / "data"
BFCL_FIXTURE = str(FIXTURES / "bfcl" / "BFCL_v4_multi_turn_miss_func.json")  # two training scenarios
needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="the math sandbox needs root and unshare"
)
# A sandbox uid of its own, so concurrently running sandbox tests cannot look like our leftovers.
ENVS = EnvsConfig(math=MathEnvConfig(sandbox=SandboxConfig(uid=61_250, gid=61_250, wall_seconds=30.0)))


# ------------------------------------------------------------------------------------------ pure metrics
def test_pass_at_k_matches_hand_computed_values() -> None:
    # 1 - C(n-c, k) / C(n, k)
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # C(3,2)=3, C(5,2)=10
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    assert pass_at_k(4, 3, 2) == 1.0 and pass_at_k(4, 0, 3) == 0.0 and pass_at_k(4, 4, 4) == 1.0
    np.testing.assert_allclose(pass_at_k(np.array([4, 4, 4]), np.array([4, 1, 0]), 2), [1.0, 0.5, 0.0])
    # pass@1 averaged over k samples is the matrix mean; pass@j averages the per-row estimator.
    s = np.array([[1, 1, 1, 1], [1, 0, 0, 0], [0, 1, 0, 1]], dtype=bool)
    assert pass_at_1_avg(s) == pytest.approx(7 / 12) == mean_pass_at_k(s, 1)
    assert mean_pass_at_k(s, 2) == pytest.approx((1 + 1 / 2 + 5 / 6) / 3)
    assert mean_pass_at_k(s, 4) == 1.0
    for bad in [(3, 1, 4), (3, 4, 1), (3, -1, 1), (3, 1, 0), (3.5, 1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)
    with pytest.raises(ValueError, match="2-d"):
        pass_at_1_avg([1, 0])


def test_domain_averages_and_qa_normalisation() -> None:
    benches = [("math", "in", {"pass_at_1": 0.5, "greedy_acc": 1.0}), ("math", "in", {"pass_at_1": 0.25}),
               ("math", "out", {"pass_at_1": 0.1, "greedy_acc": float("nan")}), ("qa", "in", {"em": 0.4})]
    avg = domain_averages(benches)
    assert avg["math/in_domain/pass_at_1"] == pytest.approx(0.375)
    assert avg["math/out_of_domain/pass_at_1"] == pytest.approx(0.1)
    assert avg["math/all/pass_at_1"] == pytest.approx((0.5 + 0.25 + 0.1) / 3)
    assert avg["math/all/greedy_acc"] == 1.0 and "math/out_of_domain/greedy_acc" not in avg  # NaN skipped
    assert avg["qa/in_domain/em"] == 0.4 and "qa/out_of_domain/em" not in avg
    with pytest.raises(ValueError, match="domain"):
        domain_averages([("math", "ood", {"pass_at_1": 1.0})])
    # SQuAD normalisation, which the QA reward (EM) and F1 share.
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert exact_match("the Kaivin.", ["Kaivin"]) == 1.0 and exact_match(None, ["Kaivin"]) == 0.0
    assert f1_score("the big red dog", ["a red dog"]) == pytest.approx(0.8)  # P=2/3, R=1
    assert f1_score("Kaivin Republic", ["Kaivin"]) == pytest.approx(2 / 3)


def _result(name: str, rows: dict[str, tuple[str, str, float]], averages: dict[str, float]) -> EvalResult:
    benches = {b: BenchmarkResult(b, b.capitalize(), fam, dom, "f", {"pass_at_1": v, "greedy_acc": v / 2})
               for b, (fam, dom, v) in rows.items()}
    return EvalResult(name, f"/ckpt/{name}", "pass_at_1", 4, True, benches, averages)


def test_engine_settings_give_one_engine_config() -> None:
    import torch

    settings = EvalEngineSettings(kind="hf", dtype="bfloat16", block_size=16, kv_cache_mb=8, max_num_seqs=4,
                                  tensor_parallel_size=2, multiprocess=True)
    ec = settings.engine_config("ckpt", seed=7, max_model_len=512)
    assert (ec.model_path, ec.kind, ec.dtype, ec.seed, ec.max_model_len, ec.block_size) == (
        "ckpt", "hf", "bfloat16", 7, 512, 16)
    assert (ec.max_num_seqs, ec.tensor_parallel_size, ec.multiprocess) == (4, 2, True)
    assert ec.gpu_memory_utilization == settings.gpu_memory_utilization == 0.85
    assert ec.kv_cache_bytes == (None if torch.cuda.is_available() else 8 << 20)


def test_comparison_table_layout_and_result_round_trip(tmp_path: Path) -> None:
    grpo = _result("GRPO", {"aime": ("math", "in", 0.2), "amc": ("math", "in", 0.5),
                            "gpqa": ("math", "out", 0.3), "hotpot": ("qa", "in", 0.4)},
                   {"math/in_domain/pass_at_1": 0.35, "math/out_of_domain/pass_at_1": 0.3,
                    "math/all/pass_at_1": 1 / 3, "qa/in_domain/pass_at_1": 0.4, "qa/all/pass_at_1": 0.4})
    trace = _result("TRACE", {"aime": ("math", "in", 0.25), "amc": ("math", "in", 0.5),
                              "gpqa": ("math", "out", float("nan"))},
                    {"math/in_domain/pass_at_1": 0.375, "math/all/pass_at_1": 0.375})
    table = comparison_table({"GRPO": grpo, "TRACE": trace})
    lines = table.splitlines()
    assert lines[0] == "### Math: pass@1 (%)"
    assert lines[2] == "| Method | Aime | Amc | ID Avg | Gpqa | Avg |"  # one OOD benchmark: no OOD Avg
    assert lines[4] == "| GRPO | 20.0 | 50.0 | 35.0 | 30.0 | 33.3 |"  # ties and lone values: not bold
    assert lines[5] == "| TRACE | **25.0** | 50.0 | **37.5** | – | **37.5** |"
    qa = lines[lines.index("### Multi-hop QA: pass@1 (%)") + 2:]
    assert qa[0] == "| Method | Hotpot |" and qa[2] == "| GRPO | 40.0 |" and qa[3] == "| TRACE | – |"
    assert "| GRPO | 10.0 |" in comparison_table({"GRPO": grpo}, metric="greedy_acc", bold_best=False)
    path = grpo.save(tmp_path / "r.json")
    back = EvalResult.load(path)
    assert back.benchmarks["aime"].metrics == grpo.benchmarks["aime"].metrics and back.averages == grpo.averages
    nan = EvalResult.load(trace.save(tmp_path / "t.json"))
    assert math.isnan(nan.benchmarks["gpqa"].metrics["pass_at_1"])
    assert grpo.flat_metrics("eval/")["eval/avg/math/in_domain/pass_at_1"] == 0.35
    with pytest.raises(ValueError, match="primary"):
        comparison_table({"a": grpo, "b": EvalResult("b", "x", "greedy_acc", 0, True, {}, {})})


# ------------------------------------------------------------------------------------------ configuration
def test_benchmarks_from_published_files_and_bad_inputs(tmp_path: Path) -> None:
    from trace_core.config import load_config

    loaded = load_benchmarks([
        BenchmarkConfig("aime24", file=str(FIXTURES / "aime24.parquet")),
        BenchmarkConfig("gpqa_diamond", file=str(FIXTURES / "gpqa_diamond.csv")),
        BenchmarkConfig("hotpotqa", file=str(FIXTURES / "hotpotqa.json")),
        BenchmarkConfig("bfcl_base", max_examples=2),
        BenchmarkConfig("bfcl_miss_param"),
        BenchmarkConfig("my_bfcl", family="fc", loader="bfcl", file=BFCL_FIXTURE),
    ], DATA, validate=False)
    by = {b.name: b for b in loaded}
    assert (by["aime24"].family, by["aime24"].domain, len(by["aime24"].examples)) == ("math", "in", 2)
    assert by["gpqa_diamond"].domain == "out" and by["gpqa_diamond"].examples[0].choices
    assert all(e.split == "test" for e in by["hotpotqa"].examples)  # benchmark files are test data
    assert len(by["bfcl_base"].examples) == 2
    assert {e.metadata["category"] for e in by["bfcl_miss_param"].examples} == {"multi_turn_miss_param"}
    assert len(by["bfcl_miss_param"].examples) == 12 and len(by["my_bfcl"].examples) == 2
    # A published BFCL file keeps only its test scenarios: both fixture entries are training scenarios.
    with pytest.raises(ValueError, match="no examples left"):
        load_benchmarks([BenchmarkConfig("bfcl_miss_func", file=BFCL_FIXTURE)], DATA, validate=False)
    for kwargs, match in [({"name": "aime24"}, "give its file"), ({"name": "nope"}, "not known"),
                          ({"name": "x", "family": "vision", "file": "f"}, "family"),
                          ({"name": "arith", "family": "qa"}, "math benchmark"),
                          ({"name": "arith", "domain": "ood"}, "domain"),
                          ({"name": "arith", "max_examples": 0}, "max_examples")]:
        with pytest.raises(ValueError, match=match):
            BenchmarkConfig(**kwargs)
    with pytest.raises(ValueError, match="does not exist"):
        load_benchmarks([BenchmarkConfig("amc23", file=str(tmp_path / "missing.jsonl"))], DATA)
    with pytest.raises(ValueError, match="holds"):  # a QA file under a math benchmark
        load_benchmarks([BenchmarkConfig("arith", file=str(DATA / "qa" / "test.jsonl"), loader="jsonl")],
                        DATA, validate=False)
    for kwargs, match in [({"samples": 1}, "samples"), ({"samples": 0, "greedy": False}, "nothing"),
                          ({"samples": 4, "pass_at": [5]}, "pass_at"), ({"benchmarks": []}, "empty"),
                          ({"benchmarks": [BenchmarkConfig("arith")] * 2}, "unique")]:
        with pytest.raises(ValueError, match=match):
            EvalConfig(**kwargs)
    # The typed YAML config: benchmarks, per-family agents and overrides.
    yaml_file = tmp_path / "eval.yaml"
    yaml_file.write_text("samples: 8\nbenchmarks:\n  - {name: aime24, file: a.parquet}\n  - {name: kbqa}\n"
                         "agents:\n  fc: {max_turns: 40}\n")
    cfg = load_config(EvalConfig, yaml_file, ["agents.math.temperature=0.6", "pass_at=[2,4]"])
    assert cfg.samples == 8 and cfg.pass_at_values() == [1, 2, 4, 8]
    assert cfg.benchmarks[0] == BenchmarkConfig("aime24", file="a.parquet") and cfg.agents.fc.max_turns == 40
    assert cfg.agents.math.temperature == 0.6 and cfg.agents.fc.max_total_tokens == 16384


# ------------------------------------------------------------------------------------------ a scripted policy
class ScriptedEngine:
    """A RolloutEngine test double that writes planned trajectories.

    ``plans[question] = (turns(right) -> list of turn texts, c, greedy_right)``: at temperature > 0
    sample ``i`` of the first turn follows the right script iff ``i < c``; at temperature 0 every
    sample follows ``greedy_right``. The first turn carries the choice as a ``[right]``/``[wrong]``
    marker that the later turns (single-sample requests) read back from the history."""

    def __init__(self, tokenizer, plans: dict[str, tuple[Callable[[bool], list[str]], int, bool]]) -> None:
        self.tokenizer = tokenizer
        self.plans = plans
        self._pending: list[GenerationRequest] = []
        self._step = 0
        self.loaded: list[object] = []

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        self._pending.extend(requests)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def load_weights(self, weights) -> None:
        self.loaded.append(weights)

    def close(self) -> None:
        pass

    def poll(self) -> list[Completion]:
        self._step += 1
        req = self._pending.pop(0)
        history = self.tokenizer.decode(list(req.prompt_token_ids), skip_special_tokens=False)
        question = history.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        script, c, greedy_right = self.plans[question]
        turn = history.count("<|im_start|>assistant") - 1
        samples = []
        for i in range(req.sampling.n):
            if turn == 0:
                right = greedy_right if req.sampling.temperature == 0 else i < c
                text = ("[right] " if right else "[wrong] ") + script(right)[0]
            else:
                text = script("[right]" in history)[turn]
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            samples.append(Sample(tuple(ids), tuple([-0.1] * len(ids)), "stop", None, text))
        return [Completion(req.request_id, req.prompt_token_ids, tuple(samples), None, self._step)]


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _bfcl_script(task) -> Callable[[bool], list[str]]:
    """Ground-truth calls one per turn and an <answer> closing each user turn; the wrong script
    drops the last call of the last user turn that has one (BFCL's checker rejects it)."""
    truth = ground_truth_tool_calls(task)
    wrong = copy.deepcopy(truth)
    last = max(i for i, t in enumerate(wrong) if t)
    wrong[last] = wrong[last][:-1]

    def turns(right: bool) -> list[str]:
        return [t for user_turn in (truth if right else wrong)
                for t in [_call(c["name"], **c["arguments"]) for c in user_turn] + ["<answer>Done.</answer>"]]
    return turns


def _plans(benchmarks) -> dict[str, tuple[Callable[[bool], list[str]], int, bool]]:
    by = {b.name: [example_to_task(e) for e in b.examples] for b in benchmarks}
    a0, a1, a2 = by["arith"]
    m0, m1 = by["mmlu_pro"]
    q0, q1 = by["kbqa"]
    (base,), (miss_func,) = by["bfcl_base"], by["bfcl_miss_func"]
    assert (a0.answer, a1.answer, a2.answer) == (["2311"], ["16331"], ["1004756571"])
    assert (m0.answer, m1.answer, q0.answer, q1.answer) == (["C"], ["B"], ["Kaivin"], ["Thansik"])
    python = _call("python", code="print(7978 * 18)")
    search = _call("search", query="Feindrair Institute location")
    plans = {
        # math: k=4; c = 4, 1, 2; greedy right, wrong, wrong; the first one uses the python tool
        a0.question: (lambda r: [python, "<answer>\\boxed{2311}</answer>" if r else "<answer>2310</answer>"], 4, True),
        a1.question: (lambda r: ["<answer>16331</answer>" if r else "<answer>16330</answer>"], 1, False),
        a2.question: (lambda r: ["<answer>1,004,756,571</answer>" if r else "<answer>1004756570</answer>"], 2, False),
        # out-of-domain multiple choice: c = 3, 0; greedy right, wrong
        m0.question: (lambda r: ["<answer>C</answer>" if r else "<answer>(A)</answer>"], 3, True),
        m1.question: (lambda r: ["<answer>B. newton</answer>" if r else "<answer>D</answer>"], 0, False),
        # QA: a search, then an alias-normalised answer (EM 1) or a partial one (EM 0, F1 2/3)
        q0.question: (lambda r: [search, "<answer>The Kaivin.</answer>" if r else "<answer>Kaivin Republic</answer>"],
                      2, True),
        q1.question: (lambda r: ["<answer>Thansik and more</answer>"], 0, False),  # F1 1/2 always
        # BFCL: c = 2 of 4 and greedy right on base; c = 0 but greedy right on missing-function
        base.question: (_bfcl_script(base), 2, True),
        miss_func.question: (_bfcl_script(miss_func), 0, True),
    }
    assert len(plans) == 9  # every first question is distinct
    return plans


@pytest.fixture(scope="module")
def qa_factory(kb_qa_index, text_encoder):
    """The real QA environment over the conftest's dense index of the embedded corpus (``DATA/qa``
    is that corpus; the index is built once per session)."""
    from trace_core.retrieval import RetrievalIndex, Retriever

    index_dir, _ = kb_qa_index
    return make_env_factory("qa", retriever=Retriever(RetrievalIndex.load(index_dir), encoder=text_encoder))


SCRIPTED_BENCHMARKS = [
    BenchmarkConfig("arith", max_examples=3),
    BenchmarkConfig("mmlu_pro", file=str(FIXTURES / "mmlu_pro.parquet")),
    BenchmarkConfig("kbqa", max_examples=2),
    BenchmarkConfig("bfcl_base", max_examples=1),
    BenchmarkConfig("bfcl_miss_func", max_examples=1),
]


@needs_sandbox
def test_scripted_policy_scores_match_hand_computed_values_and_log_to_mlflow(
        tiny_models, tiny_tokenizer, qa_factory, server, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from trace_core.tracking import MLflowTracker, TrackingConfig

    fc_agent = AgentConfig(max_turns=40, max_new_tokens=200, max_total_tokens=200_000)
    config = EvalConfig(name="scripted", benchmarks=SCRIPTED_BENCHMARKS, data_dir=str(DATA), samples=4, pass_at=[2],
                        agents=FamilyAgents(fc=fc_agent), envs=ENVS, validate=False, output_dir=str(tmp_path / "out"),
                        log_step=7)
    engine = ScriptedEngine(tiny_tokenizer, _plans(load_benchmarks(SCRIPTED_BENCHMARKS, DATA, validate=False)))
    tracker = MLflowTracker(TrackingConfig(tracking_uri=server.uri, experiment="eval-test",
                                           spool_dir=str(tmp_path / "spool")))
    result = evaluate(tiny_models[0], config, engine=engine, tracker=tracker,
                      env_factories={"qa": qa_factory})
    tracker.close()
    assert engine.loaded == [tiny_models[0]]  # a passed engine gets the checkpoint's weights
    m = {name: b.metrics for name, b in result.benchmarks.items()}
    # math, k=4, c = (4, 1, 2): pass@1 = 7/12; pass@2 = (1 + (1 - 3/6) + (1 - 1/6)) / 3; greedy 1/3
    assert m["arith"]["pass_at_1"] == pytest.approx(7 / 12)
    assert m["arith"]["pass_at_2"] == pytest.approx((1 + 1 / 2 + 5 / 6) / 3)
    assert m["arith"]["pass_at_4"] == 1.0 and m["arith"]["greedy_acc"] == pytest.approx(1 / 3)
    assert m["arith"]["tool_calls"] == pytest.approx(4 / 12) and m["arith"]["turns"] == pytest.approx(16 / 12)
    assert m["arith"]["answered"] == 1.0 and m["arith"]["prompt_too_long"] == 0
    # multiple choice (out of domain), c = (3, 0): pass@1 3/8, pass@2 = (1 + 0)/2, greedy 1/2
    assert m["mmlu_pro"]["pass_at_1"] == pytest.approx(3 / 8) and m["mmlu_pro"]["pass_at_2"] == 0.5
    assert m["mmlu_pro"]["greedy_acc"] == 0.5
    # QA: EM = pass@1 = 2/8; F1 = (1 + 1 + 2/3 + 2/3 + 4 * 1/2) / 8 = 2/3; greedy EM 1/2, F1 (1 + 1/2)/2
    assert m["kbqa"]["em"] == m["kbqa"]["pass_at_1"] == pytest.approx(0.25)
    assert m["kbqa"]["f1"] == pytest.approx(2 / 3)
    assert m["kbqa"]["greedy_acc"] == m["kbqa"]["greedy_em"] == 0.5 and m["kbqa"]["greedy_f1"] == pytest.approx(0.75)
    assert m["kbqa"]["tool_calls"] == 0.5  # one search in each of the first question's 4 samples
    # BFCL with the official checker: base c=2 of 4, greedy right; missing-function c=0, greedy right
    assert m["bfcl_base"]["pass_at_1"] == 0.5 and m["bfcl_base"]["pass_at_2"] == pytest.approx(5 / 6)
    assert m["bfcl_base"]["greedy_acc"] == 1.0
    assert m["bfcl_miss_func"]["pass_at_1"] == 0.0 and m["bfcl_miss_func"]["greedy_acc"] == 1.0
    # in-/out-of-domain averages, unweighted over benchmarks
    avg = result.averages
    assert avg["math/in_domain/pass_at_1"] == pytest.approx(7 / 12)
    assert avg["math/out_of_domain/pass_at_1"] == pytest.approx(3 / 8)
    assert avg["math/all/pass_at_1"] == pytest.approx((7 / 12 + 3 / 8) / 2)
    assert avg["qa/all/f1"] == pytest.approx(2 / 3) and avg["fc/in_domain/pass_at_1"] == 0.25
    assert avg["fc/all/greedy_acc"] == 1.0

    # The per-example file: one line per example, its samples, the checker's verdicts.
    lines = [json.loads(x) for x in Path(result.files["examples"]).read_text().splitlines()]
    assert [(r["benchmark"], r["c"]) for r in lines] == [
        ("arith", 4), ("arith", 1), ("arith", 2), ("mmlu_pro", 3), ("mmlu_pro", 0), ("kbqa", 2), ("kbqa", 0),
        ("bfcl_base", 2), ("bfcl_miss_func", 0)]
    base = lines[7]
    assert [s["error_type"] is None for s in base["samples"]] == [True, True, False, False]
    assert all(s["error_type"].startswith("multi_turn:") for s in base["samples"][2:])
    assert base["greedy"]["success"] and base["greedy"]["error_type"] is None
    assert lines[5]["samples"][0]["answer"] == "The Kaivin." and lines[5]["samples"][2]["f1"] == pytest.approx(2 / 3)
    assert all(len(r["samples"]) == 4 for r in lines)

    table = comparison_table({"scripted": result})
    print("\n" + table)
    assert "| scripted | 58.3 | 37.5 | 47.9 |" in table  # Arith | MMLU-Pro | Avg
    assert "| scripted | 25.0 |" in table and "| scripted | 50.0 | 0.0 | 25.0 |" in table
    assert "### Details" in Path(result.files["summary"]).read_text()

    # MLflow: metrics at the configured step, the per-example table and summary as artifacts.
    client = MlflowClient(tracking_uri=server.uri)
    run = client.get_run(tracker.run_id)
    assert run.data.metrics["eval/arith/pass_at_1"] == pytest.approx(7 / 12)
    assert run.data.metrics["eval/kbqa/f1"] == pytest.approx(2 / 3)
    assert run.data.metrics["eval/avg/math/out_of_domain/pass_at_1"] == pytest.approx(3 / 8)
    assert [h.step for h in client.get_metric_history(tracker.run_id, "eval/bfcl_base/greedy_acc")] == [7]
    assert run.data.params["eval/samples"] == "4" and run.data.tags["trace.kind"] == "evaluation"
    assert not any(k.startswith("eval/scripted/") for k in run.data.params)  # names shared by every method's run
    files = {f.path for f in client.list_artifacts(tracker.run_id, "eval/scripted")}
    assert files == {"eval/scripted/examples.jsonl", "eval/scripted/summary.md", "eval/scripted/result.json"}
    logged = Path(client.download_artifacts(tracker.run_id, "eval/scripted/examples.jsonl", str(tmp_path)))
    assert logged.read_text() == Path(result.files["examples"]).read_text()


# ------------------------------------------------------------------------------------------ the real engine
@needs_sandbox
def test_tiny_checkpoints_on_every_family_through_vllm(tiny_models, vllm_engine, qa_factory, tmp_path: Path) -> None:
    """Random tiny policies on the shared vLLM engine: math and QA run (rewards all 0); BFCL prompts
    (~10k tokens with the tiny tokenizer) do not fit a 1024-token engine and count as failures."""
    agent = AgentConfig(max_turns=2, max_new_tokens=16, max_total_tokens=1024, temperature=1.0)
    benchmarks = [BenchmarkConfig("arith", max_examples=2), BenchmarkConfig("kbqa", max_examples=2),
                  BenchmarkConfig("bfcl_base", max_examples=1)]
    results = {}
    try:
        for seed in (0, 1):
            config = EvalConfig(name=f"tiny-seed{seed}", benchmarks=benchmarks, data_dir=str(DATA), samples=2,
                                agents=FamilyAgents(math=agent, qa=agent, fc=agent), envs=ENVS, validate=False,
                                output_dir=str(tmp_path / f"seed{seed}"))
            results[seed] = evaluate(tiny_models[seed], config, engine=vllm_engine,
                                     env_factories={"qa": qa_factory})
    finally:
        vllm_engine.load_weights(tiny_models[0])  # the session engine holds seed 0's weights
    for res in results.values():
        lines = [json.loads(x) for x in Path(res.files["examples"]).read_text().splitlines()]
        assert [r["benchmark"] for r in lines] == ["arith", "arith", "kbqa", "kbqa", "bfcl_base"]
        for r in lines[:4]:
            assert not r["prompt_too_long"] and len(r["samples"]) == 2 and r["greedy"] is not None
            for s in r["samples"] + [r["greedy"]]:
                assert 1 <= s["turns"] <= 2 and s["gen_tokens"] <= 32 and s["total_tokens"] <= 1024
                assert s["success"] == (s["reward"] > 0.5)
        assert lines[4]["prompt_too_long"] and lines[4]["samples"] == [] and lines[4]["greedy"] is None
        for name, b in res.benchmarks.items():  # every metric agrees with the per-example file
            mine = [r for r in lines if r["benchmark"] == name]
            assert b.metrics["pass_at_1"] == pytest.approx(np.mean([r["c"] / 2 for r in mine]))
            assert b.metrics["examples"] == len(mine)
        assert res.benchmarks["bfcl_base"].metrics["prompt_too_long"] == 1
        assert res.benchmarks["bfcl_base"].metrics["pass_at_1"] == 0.0
        assert math.isnan(res.benchmarks["bfcl_base"].metrics["turns"])
        assert res.rollout["math/sampled"]["trajectories"] == 4 and res.rollout["qa/greedy"]["trajectories"] == 4
        for family in ("math", "qa"):  # greedy: one decode per turn of a group; its twin is served the copy
            greedy = res.rollout[f"{family}/greedy"]
            assert greedy["decoded_requests"] + greedy["reused_requests"] == greedy["requests"]
            assert greedy["decoded_requests"] == greedy["turns"] / 2 and greedy["reused_requests"] > 0
    # The engine really ran each checkpoint's weights: the two policies wrote different turns.
    first = [json.loads(Path(r.files["examples"]).read_text().splitlines()[0])["samples"][0]["actions"]
             for r in results.values()]
    assert first[0] != first[1]
    table = comparison_table({"ReAct (seed 0)": results[0], "ReAct (seed 1)": results[1]})
    print("\n" + table)
    assert "| Method | Base |" in table and "| Method | Arith |" in table
    assert "| ReAct (seed 1) | 0.0 |" in table and "**" not in table  # all-zero columns: nothing in bold


def test_progress_chunks_give_the_same_rollouts_as_one_batch(tiny_models, vllm_engine, qa_factory, tmp_path: Path,
                                                             capsys) -> None:
    """Evaluation rolls out in chunks with a progress line after each; the per-request seeds do not
    depend on the batch, so the records equal those of one batch."""
    agent = AgentConfig(max_turns=2, max_new_tokens=12, max_total_tokens=1024, temperature=1.0)
    records = {}
    for every in (0, 1):
        config = EvalConfig(name=f"chunks{every}", benchmarks=[BenchmarkConfig("arith", max_examples=3)],
                            data_dir=str(DATA), samples=2, agents=FamilyAgents(math=agent, qa=agent, fc=agent),
                            envs=ENVS, validate=False, output_dir=str(tmp_path / f"every{every}"),
                            progress_every=every)
        res = evaluate(tiny_models[0], config, engine=vllm_engine, env_factories={"qa": qa_factory})
        records[every] = [{k: v for k, v in json.loads(x).items() if k != "wall_s"}
                          for x in Path(res.files["examples"]).read_text().splitlines()]
    out = capsys.readouterr().out
    assert records[0] == records[1]
    assert "progress: chunks1 math/sampled: 1/3 examples" in out and "3/3 examples" in out
    assert "progress: chunks0" not in out  # 0: one batch, silent


def test_cli_help_and_a_run_on_the_transformers_engine(tiny_models, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "--checkpoint" in capsys.readouterr().out
    earlier = _result("GRPO", {"arith": ("math", "in", 0.5)}, {}).save(tmp_path / "grpo.json")
    args = ["--checkpoint", str(tiny_models[0]), "--benchmarks", "arith", "--data", str(DATA), "--engine", "hf",
            "--k", "2", "--no-greedy", "--max-examples", "1", "--max-turns", "1", "--max-new-tokens", "4",
            "--max-total-tokens", "1024", "--name", "cli", "--out", str(tmp_path / "cli"),
            "--set", f"envs.math.sandbox.uid={61_251}", "--set", f"envs.math.sandbox.gid={61_251}",
            "--compare", f"GRPO={earlier}"]
    if os.geteuid() != 0:
        pytest.skip("the math sandbox needs root")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| Method | Arith |" in out and "| GRPO | **50.0** |" in out and "| cli | 0.0 |" in out
    result = EvalResult.load(tmp_path / "cli" / "result.json")
    assert result.config["samples"] == 2 and result.benchmarks["arith"].metrics["examples"] == 1
    assert not result.greedy and "greedy_acc" not in result.benchmarks["arith"].metrics


@needs_sandbox
def test_a_warm_started_checkpoint_on_every_family_end_to_end(warm_checkpoint: Path, qa_factory,
                                                              tmp_path: Path) -> None:

    """The warm-started checkpoint through the evaluator on the transformers engine: math (sandbox),
    multi-hop QA (dense retriever) and BFCL (backends + checker). Its turns are the demonstrated
    format: it makes tool calls, unlike the random model it started from. BFCL's prompts (~10k
    tokens with this tokenizer) run in full: the checkpoint has the positions for them (RoPE)."""
    # T = 0.5: after a short SFT the turn format's tokens have p = 0.2-0.9 each (measured on a
    # demonstration), so at T = 1 a 50-token call rarely parses; the greedy argmax is the format.
    agent = AgentConfig(max_turns=3, max_new_tokens=80, max_total_tokens=2048, temperature=0.5)
    fc_agent = AgentConfig(max_turns=1, max_new_tokens=16, max_total_tokens=24_576, temperature=0.5)
    config = EvalConfig(name="warm", benchmarks=[BenchmarkConfig("arith", max_examples=3),
                                                 BenchmarkConfig("kbqa", max_examples=3),
                                                 BenchmarkConfig("bfcl_base", max_examples=1)],
                        data_dir=str(DATA), samples=2, greedy=False, engine=EvalEngineSettings(kind="hf"),
                        agents=FamilyAgents(math=agent, qa=agent, fc=fc_agent), envs=ENVS, validate=False,
                        output_dir=str(tmp_path / "warm"))
    result = evaluate(warm_checkpoint, config, env_factories={"qa": qa_factory})
    lines = [json.loads(x) for x in Path(result.files["examples"]).read_text().splitlines()]
    assert [r["benchmark"] for r in lines] == ["arith"] * 3 + ["kbqa"] * 3 + ["bfcl_base"]
    for r in lines:
        assert not r["prompt_too_long"] and len(r["samples"]) == 2
        assert r["c"] == sum(s["success"] for s in r["samples"])
    bfcl = lines[6]["samples"]
    assert all(s["turns"] >= 1 and s["total_tokens"] > 4_096 for s in bfcl), bfcl  # the whole prompt went in
    assert result.benchmarks["bfcl_base"].metrics["pass_at_1"] == np.mean([s["success"] for s in bfcl])
    # The same episodes from the random model it started from: the warm start is what makes tool calls.
    init = evaluate(warm_checkpoint.parent / "init", dataclasses.replace(
        config, name="init", benchmarks=config.benchmarks[:2], output_dir=str(tmp_path / "init")),
        env_factories={"qa": qa_factory})
    calls = {name: (result.benchmarks[name].metrics["tool_calls"], init.benchmarks[name].metrics["tool_calls"])
             for name in ("arith", "kbqa")}
    print(calls)
    assert all(warm > 0 for warm, _ in calls.values()) and sum(w for w, _ in calls.values()) > sum(
        i for _, i in calls.values()), calls
