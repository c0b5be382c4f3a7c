"""The three task environments and the retriever index, end to end through the tree executor.

Episodes are driven three ways: by a scripted expert — a test double of the *engine* only, which
reads each request's history and writes the expert's next action as token ids (right or wrong
depending on the sample's seed, so trees hold both rewards) —, by the session's warm-started tiny
policy (``conftest.warm_checkpoint``) sampled at T = 1 on the training tasks it was fitted to, whose
rewards are mixed because it reproduces demonstrations of which some are wrong, and by the random
tiny Qwen3 on the transformers engine, whose garbage the loop must survive. The environments, executor,
sandbox, retriever and BFCL backends/checker are all real.

Every trajectory's reward is checked against an independent replay of its whole root-to-leaf
action path in a fresh environment: continuations start from restored snapshots, so this is
prefix restore checked inside the loop; the direct restore tests compare state explicitly.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from trace_core.data import arith, bfcl, kb
from trace_core.envs.common import SingleToolEnvironment, function_tool
from trace_core.envs.fc_env import (
    FCEnvConfig,
    FCEnvironment,
    FCSnapshot,
    check_call_turns,
    ground_truth_tool_calls,
    initial_functions,
)
from trace_core.envs.math_env import MathEnvConfig, MathSnapshot, answer_is_correct, math_equal
from trace_core.envs.qa_env import QAEnvConfig, QAEnvironment, exact_match, f1_score, normalize_answer
from trace_core.envs.registry import EnvsConfig, example_to_task, make_env_factory
from trace_core.envs.sandbox import SandboxConfig
from trace_core.methods import get_method
from trace_core.retrieval import (
    RetrievalIndex,
    Retriever,
    RetrieverConfig,
    TextEncoder,
    build_index,
    main,
    make_faiss_index,
)
from trace_core.rollout.agent import AgentConfig
from trace_core.rollout.engine import Completion, EngineConfig, GenerationRequest, Sample
from trace_core.rollout.env import Action, Environment, Episode, Observation, Task, parse_action
from trace_core.rollout.executor import RolloutResult, TreeRolloutExecutor, expansion_of

needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="the math sandbox needs root and unshare"
)
# A uid of its own, so concurrently running sandbox tests cannot look like our leftovers.
MATH_CONFIG = MathEnvConfig(sandbox=SandboxConfig(uid=61_240, gid=61_240, wall_seconds=30.0))


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    from trace_core.models import TinyQwen3Config, build_tiny_qwen3

    model_dir = build_tiny_qwen3(tmp_path_factory.mktemp("tiny"), TinyQwen3Config(vocab_size=512, seed=1))
    return model_dir, AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def kb_data():
    _, passages, splits = kb.generate(kb.KBConfig())
    return passages, splits["train"]


@pytest.fixture(scope="module")
def encoder(text_encoder) -> TextEncoder:
    return text_encoder  # conftest: loaded once per session


@pytest.fixture(scope="module")
def index_dir(kb_qa_index, kb_data) -> Path:
    out, report = kb_qa_index  # conftest: the embedded corpus's flat index, built once per session
    passages, _ = kb_data
    assert (report.num_passages, report.dim) == (len(passages), 384) and report.passages_per_second > 0
    return out


@pytest.fixture(scope="module")
def retriever(index_dir: Path, encoder: TextEncoder) -> Retriever:
    return Retriever(RetrievalIndex.load(index_dir), encoder=encoder)


@pytest.fixture(scope="module")
def qa_factory(index_dir: Path, retriever: Retriever):
    return make_env_factory("qa", EnvsConfig(qa=QAEnvConfig(index_dir=str(index_dir))), retriever=retriever)


def fc_tasks(categories: Sequence[str] = bfcl.CATEGORIES) -> list[Task]:
    """One embedded BFCL entry per category, each of another scenario (so first questions differ)."""
    subset = bfcl.bfcl_subset(60)
    tasks = []
    for i, category in enumerate(categories):
        entries = sorted((ex for ex in subset if ex.metadata["category"] == category),
                         key=lambda ex: ex.metadata["scenario"])
        tasks.append(example_to_task(entries[i]))
    assert len({t.question for t in tasks}) == len(tasks)
    return tasks


# ------------------------------------------------------------------------------------------ engine test double
class ScriptedEngine:
    """A RolloutEngine that writes an expert's next turn: ``policy(history_text, seed) -> text``.

    One request is answered per poll; sample ``i`` gets seed ``sampling.seed + i`` (the real
    engines' rule), which the policies use to answer right or wrong."""

    def __init__(self, tokenizer, policy: Callable[[str, int], str]) -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self._pending: list[GenerationRequest] = []
        self._step = 0

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        self._pending.extend(requests)

    def poll(self) -> list[Completion]:
        self._step += 1
        req = self._pending.pop(0)
        history = self.tokenizer.decode(list(req.prompt_token_ids), skip_special_tokens=False)
        samples = []
        for i in range(req.sampling.n):
            ids = self.tokenizer.encode(self.policy(history, (req.sampling.seed or 0) + i),
                                        add_special_tokens=False)
            samples.append(Sample(tuple(ids), tuple([-0.1] * len(ids)), "stop", None, self.tokenizer.decode(ids)))
        return [Completion(req.request_id, req.prompt_token_ids, tuple(samples), None, self._step)]

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def load_weights(self, weights) -> None:  # pragma: no cover - not used by these tests
        raise NotImplementedError

    def close(self) -> None:
        self._pending.clear()


def question_of(history: str) -> str:
    return re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", history, re.S).group(1)


def past_turns(history: str) -> list[str]:
    """The assistant turns already in the history (the open one at the end has no <|im_end|>)."""
    return re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", history, re.S)


def last_observation(history: str) -> str:
    return re.findall(r"<tool_response>\n(.*?)\n</tool_response>", history, re.S)[-1]


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def math_policy(tasks: dict[str, Task]) -> Callable[[str, int], str]:
    """Cell 1 computes ``answer`` (the solution without its print), cell 2 prints it (so the value
    must survive across turns), then the boxed answer — off by a digit when seed % 3 == 0."""

    def policy(history: str, seed: int) -> str:
        task = tasks[question_of(history)]
        turn = len(past_turns(history))
        if turn == 0:
            *body, last = task.metadata["solution_code"].rstrip().split("\n")
            return "I will compute it. " + call("python", code="\n".join([*body, f"answer = {last[6:-1]}"]))
        if turn == 1:
            return call("python", code="print(answer)")
        value = last_observation(history).strip()
        return f"<answer>\\boxed{{{value + '1' if seed % 3 == 0 else value}}}</answer>"

    return policy


def qa_policy(tasks: dict[str, Task]) -> Callable[[str, int], str]:
    """One search per hop of the question's path, then the answer — a wrong one when seed % 3 == 0."""

    def policy(history: str, seed: int) -> str:
        task = tasks[question_of(history)]
        turn = len(past_turns(history))
        path = task.metadata["path"]
        if turn < len(path):
            step = path[turn]
            return call("search", query=f"{step['entity']} {step['relation'].replace('_', ' ')}")
        return f"<answer>{'Nowhere' if seed % 3 == 0 else task.answer[0]}</answer>"

    return policy


def fc_policy(tasks: dict[str, Task]) -> Callable[[str, int], str]:
    """BFCL's ground-truth calls turn by turn, each turn closed by an answer; where seed % 4 == 0
    it closes the turn early instead of making the next call (a wrong trajectory)."""
    scripts = {t.question: ground_truth_tool_calls(t) for t in tasks.values()}

    def policy(history: str, seed: int) -> str:
        script = scripts[question_of(history)]
        done = past_turns(history)
        turn = sum("<answer>" in t for t in done)
        made = 0
        for t in reversed(done):
            if "<answer>" in t:
                break
            made += 1
        calls = script[turn]
        if made < len(calls) and seed % 4 != 0:
            return call(calls[made]["name"], **calls[made]["arguments"])
        return "<answer>Done.</answer>"

    return policy


def run_executor(engine, tokenizer, factory, tasks: list[Task], m: int, n_expand: int, agent: AgentConfig,
                 seed: int = 0) -> RolloutResult:
    executor = TreeRolloutExecutor(engine, tokenizer, factory, agent, tool_workers=2)

    def scorer(tree, nodes):
        return np.random.default_rng(len(tree.nodes)).random(len(nodes))

    return executor.run(tasks, [m] * len(tasks), expansion_of(get_method("trace"), n_expand, scorer),
                        np.random.default_rng(seed))


def replayed_reward(factory, task: Task, tree, leaf: int) -> float:
    """Reward of the root-to-leaf path, re-run from scratch in a fresh environment."""
    env = factory(task)
    env.reset(task)
    actions, observations = [], []
    for node in tree.path(leaf)[1:]:
        action = parse_action(tree.nodes[node].info["action"])
        actions.append(action)
        observations.append(env.step(action))
    return env.reward(Episode(task, actions, observations))


def check_trees(result: RolloutResult, factory, tasks: list[Task]) -> list[float]:
    by_id = {t.id: t for t in tasks}
    rewards = []
    for tree in result.trees:
        tree.validate()
        assert any(t.kind == "continuation" for t in tree.trajectories)
        for traj in tree.trajectories:
            reward = tree.trajectory_reward(traj.id)
            assert reward == replayed_reward(factory, by_id[tree.prompt_id], tree, traj.leaf)
            rewards.append(reward)
    return rewards


def warm_policy_trees(warm_checkpoint: Path, family: str, factory, agent: AgentConfig,
                      task_ids: Sequence[str] = (), m: int = 4):
    """The warm-started policy (HF engine, T = 1) through the TRACE executor on the training tasks it
    was warm-started on (``task_ids``, else the first WARM_TRAIN_TASKS), ``m`` bare rollouts per
    task plus one continuation each; returns the rewards (each checked against a fresh replay)
    and the result."""
    from conftest import DATA, WARM_TRAIN_TASKS

    from trace_core.rollout.hf_engine import HFEngine
    from trace_core.warmstart.pipeline import WarmStartConfig, training_tasks

    # The warm start's own task selection, so these are exactly the tasks the fixture demonstrated.
    tasks = training_tasks(WarmStartConfig(data_dir=str(DATA), train_tasks=WARM_TRAIN_TASKS,
                                           train_task_ids=tuple(task_ids)), family)
    engine = HFEngine(EngineConfig(model_path=str(warm_checkpoint), seed=0,
                                   max_model_len=agent.max_total_tokens + agent.max_new_tokens))
    try:
        result = run_executor(engine, engine.tokenizer, factory, tasks, m=m, n_expand=1, agent=agent)
    finally:
        engine.close()
    return check_trees(result, factory, tasks), result


# ------------------------------------------------------------------------------------------ math
@needs_sandbox
def test_math_episodes_of_a_warm_started_policy_have_mixed_rewards(warm_checkpoint: Path) -> None:
    agent = AgentConfig(max_turns=3, max_new_tokens=96, max_total_tokens=2048, temperature=1.0)
    rewards, result = warm_policy_trees(warm_checkpoint, "math", make_env_factory("math", MATH_CONFIG), agent)
    print("math rewards", rewards)
    assert set(rewards) == {0.0, 1.0}
    # The policy's own tool calls ran in the sandbox: every tree has a `python` turn with output.
    for tree in result.trees:
        assert any('"python"' in n.info.get("action", "") for n in tree.nodes), tree.prompt_id


@needs_sandbox
def test_math_episodes_through_the_executor_with_mixed_rewards(tiny) -> None:
    _, tokenizer = tiny
    examples = arith.generate(arith.ArithConfig())["train"]
    tasks = [example_to_task(examples[0]), example_to_task(examples[3])]  # an integer and a fraction answer
    factory = make_env_factory("math", MATH_CONFIG)
    engine = ScriptedEngine(tokenizer, math_policy({t.question: t for t in tasks}))
    agent = AgentConfig(max_turns=4, max_new_tokens=400, max_total_tokens=4096)
    result = run_executor(engine, tokenizer, factory, tasks, m=2, n_expand=1, agent=agent)
    rewards = check_trees(result, factory, tasks)
    assert set(rewards) == {0.0, 1.0}
    assert result.stats.tool_errors == 0  # every cell ran, including `print(answer)` after a restore
    for tree in result.trees:  # every trajectory: two cells then an answer
        assert {tree.nodes[leaf].depth for leaf in tree.leaves()} == {3}


@needs_sandbox
def test_math_prefix_restore_reproduces_variables() -> None:
    factory = make_env_factory("math", MATH_CONFIG)
    task = Task("t", "q", ["12"])
    dump = "print(sorted((k, repr(v)) for k, v in globals().items() if not k.startswith('_')))"
    original = factory(task)
    original.reset(task)
    snapshots, failed = [], []
    cells = ["x = 3", "y = x * 4\nimport fractions\nz = fractions.Fraction(7, 3)",
             "q = 1\nprint('x' * 100_000)", "w = y + 1"]  # the third is stopped at the output cap
    for code in cells:
        failed.append(original.step(Action(raw="", tool="python", arguments={"code": code})).tool_error)
        snapshots.append(original.snapshot())
    assert failed == [False, False, True, False]
    state_at_end = original.step(Action(raw="", tool="python", arguments={"code": dump})).text
    assert "('w', '13')" in state_at_end and "('z', 'Fraction(7, 3)')" in state_at_end
    assert "'q'" not in state_at_end

    # The stopped cell is not state; restoring the last prefix (also from its JSON) gives the same globals.
    assert len(snapshots[3].tool.cells) == 3
    for snap in (snapshots[3], MathSnapshot.from_json(json.loads(json.dumps(snapshots[3].to_json())))):
        fresh = factory(task)
        fresh.restore(snap)
        assert fresh.step(Action(raw="", tool="python", arguments={"code": dump})).text == state_at_end

    # Branching: two instances restored at an earlier prefix evolve independently.
    a, b = factory(task), factory(task)
    a.restore(snapshots[1])
    b.restore(snapshots[1])
    a.step(Action(raw="", tool="python", arguments={"code": "y = -1"}))
    assert a.step(Action(raw="", tool="python", arguments={"code": "print(x, y)"})).text == "3 -1"
    assert b.step(Action(raw="", tool="python", arguments={"code": "print(x, y)"})).text == "3 12"
    assert "'w'" not in b.step(Action(raw="", tool="python", arguments={"code": dump})).text


@needs_sandbox
def test_math_tool_errors_and_observation_limits() -> None:
    config = MathEnvConfig(sandbox=MATH_CONFIG.sandbox, max_observation_chars=50)
    env = make_env_factory("math", config)(Task("t", "q", ["1"]))
    env.reset(Task("t", "q", ["1"]))
    long = env.step(Action(raw="", tool="python", arguments={"code": "print('a' * 500)"}))
    assert long.text.startswith("a" * 50) and "observation truncated" in long.text and not long.tool_error
    assert env.step(Action(raw="", tool="python", arguments={"code": "1/0"})).tool_error
    assert "unknown tool" in env.step(Action(raw="", tool="search", arguments={"query": "x"})).text
    assert "non-empty string" in env.step(Action(raw="", tool="python", arguments={"code": 3})).text
    bad = env.step(parse_action("<tool_call>{oops</tool_call>"))
    assert bad.tool_error and "not valid JSON" in bad.text
    assert env.step(parse_action("<answer>1</answer>")).done


def test_math_answer_equivalence_rules() -> None:
    assert math_equal("7/3", "7/3") and math_equal("\\frac{7}{3}", "7/3") and math_equal("\\dfrac73", "7/3")
    assert math_equal("2.333333", "7/3") and math_equal("2.3333333333", "7/3")
    assert not math_equal("2.3333", "7/3") and not math_equal("2.33", "7/3")  # truncated decimals are wrong
    assert math_equal("3,175", "3175") and math_equal("0.5", "1/2") and math_equal("1+x", "x+1")
    assert not math_equal("3176", "3175") and not math_equal("hello", "3175")
    assert not math_equal("__import__('os').getcwd()", "1")  # the sympy fallback parses arithmetic only
    task = Task("t", "q", ["42810/73"])
    assert answer_is_correct("So the answer is \\boxed{\\frac{42810}{73}}.", task)
    assert answer_is_correct("42810/73", task)  # a bare value
    assert not answer_is_correct("\\boxed{586.43}", task) and not answer_is_correct(None, task)
    mc = Task("m", "q", ["C"], {"choices": ["a", "b", "c", "d"]})
    assert answer_is_correct("\\boxed{C}", mc) and answer_is_correct("(c) because", mc)
    assert not answer_is_correct("B", mc) and not answer_is_correct("E", mc)
    with pytest.raises(ValueError, match="answer must be"):
        answer_is_correct("1", Task("t", "q", None))


# ------------------------------------------------------------------------------------------ qa
def test_qa_episodes_through_the_executor_with_mixed_rewards(tiny, qa_factory, kb_data) -> None:
    _, tokenizer = tiny
    _, questions = kb_data
    tasks = [example_to_task(ex) for ex in questions[:2]]
    engine = ScriptedEngine(tokenizer, qa_policy({t.question: t for t in tasks}))
    agent = AgentConfig(max_turns=6, max_new_tokens=200, max_total_tokens=4096)
    result = run_executor(engine, tokenizer, qa_factory, tasks, m=2, n_expand=1, agent=agent)
    rewards = check_trees(result, qa_factory, tasks)
    assert set(rewards) == {0.0, 1.0}
    for tree, task in zip(result.trees, tasks, strict=True):
        # Each hop's search showed the passage that hop needs.
        leaf = tree.leaves()[0]
        history = tokenizer.decode(tree.history_tokens(leaf), skip_special_tokens=False)
        for step in task.metadata["path"]:
            assert f"] {step['entity']}:" in history


def test_qa_episodes_of_a_warm_started_policy_have_mixed_rewards(warm_checkpoint: Path, qa_factory) -> None:
    agent = AgentConfig(max_turns=6, max_new_tokens=96, max_total_tokens=2048, temperature=1.0)
    rewards, result = warm_policy_trees(warm_checkpoint, "qa", qa_factory, agent)
    print("qa rewards", rewards)
    assert set(rewards) == {0.0, 1.0}
    for tree in result.trees:  # the policy's own searches ran on the dense index
        assert any('"search"' in n.info.get("action", "") for n in tree.nodes), tree.prompt_id


def test_search_returns_the_passage_a_question_needs(retriever: Retriever, kb_data) -> None:
    passages, questions = kb_data
    by_id = {p.id: p for p in passages}
    for ex in questions[:20]:
        first = ex.metadata["path"][0]
        hits = retriever.search(f"{first['entity']} {first['relation'].replace('_', ' ')}", k=3)
        assert first["passage"] in [h.passage.id for h in hits]
        assert hits[0].score >= hits[-1].score
    # A whole natural-language question retrieves its first hop's passage, best first.
    person = by_id["person-004-bio"]
    hits = retriever.search(f"Where was {person.title} born?", k=3)
    assert hits[0].passage.id == "person-004-bio"


def test_ivf_and_hnsw_indexes_agree_with_flat(index_dir: Path, retriever: Retriever) -> None:
    flat = retriever.index
    vectors = flat.index.reconstruct_n(0, flat.index.ntotal)
    queries = retriever.encoder.encode_queries([p.title + " " + p.text[:40] for p in flat.passages[::17]])
    truth = [h[0].passage.id for h in flat.search_vectors(queries, 1)]
    for kind in ("ivf", "hnsw"):
        index, params = make_faiss_index(vectors, RetrieverConfig(index_type=kind, ivf_nprobe=64))
        other = RetrievalIndex(index, flat.passages, flat.manifest)
        assert [h[0].passage.id for h in other.search_vectors(queries, 1)] == truth, kind
        assert params
    with pytest.raises(ValueError, match="exceeds the number of passages"):
        make_faiss_index(vectors[:3], RetrieverConfig(index_type="ivf", ivf_nlist=5))


def test_index_cli_writes_one_artifact_and_reports_throughput(tmp_path: Path, kb_data, encoder, capsys) -> None:
    passages, _ = kb_data
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p.to_record()) + "\n" for p in passages[:40]))
    out = tmp_path / "idx"
    assert main(["build", "--corpus", str(corpus), "--out", str(out), "--index-type", "hnsw", "--no-validate",
                 "--no-progress", "--batch-size", "16"]) == 0
    printed = capsys.readouterr().out
    assert "40 passages" in printed and "passages/s" in printed
    assert sorted(p.name for p in out.iterdir()) == ["index.faiss", "manifest.json", "passages.jsonl"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["index_type"] == "hnsw" and manifest["num_passages"] == 40 and manifest["dim"] == 384
    assert manifest["query_prefix"] == "" and manifest["passages_per_second"] > 0
    assert manifest["model_path"] == ""  # the preset's weights, found again wherever the index is loaded
    assert Retriever(RetrievalIndex.load(out)).encoder.model_path == encoder.model_path
    loaded = Retriever(RetrievalIndex.load(out), encoder=encoder)
    assert [p.id for p in loaded.index.passages] == [p.id for p in passages[:40]]
    assert loaded.search(passages[5].title + " " + passages[5].text, k=1)[0].passage.id == passages[5].id
    # Rebuilding replaces the artifact; a directory that is not an index is never replaced.
    build_index(passages[:10], out, RetrieverConfig(index_type="ivf"), encoder=encoder, progress=False)
    assert RetrievalIndex.load(out).manifest["num_passages"] == 10
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a retrieval index"):
        main(["build", "--corpus", str(corpus), "--out", str(foreign), "--no-validate", "--no-progress"])
    assert [p.name for p in foreign.iterdir()] == ["keep.txt"]


def test_retrieval_bad_inputs(tmp_path: Path, kb_data) -> None:
    passages, _ = kb_data
    with pytest.raises(ValueError, match="index_type"):
        RetrieverConfig(index_type="lsh")
    with pytest.raises(ValueError, match="encoder"):
        RetrieverConfig(encoder="bert")
    with pytest.raises(ValueError, match="not a retrieval index"):
        RetrievalIndex.load(tmp_path)
    with pytest.raises(ValueError, match="unique ids"):
        build_index([passages[0], passages[0]], tmp_path / "x", progress=False)
    with pytest.raises(ValueError, match="empty"):
        build_index([], tmp_path / "x", progress=False)
    e5 = RetrieverConfig(encoder="e5-base-v2")  # the cluster's encoder: config and prefixes only here
    assert e5.prefixes() == ("query: ", "passage: ") and e5.resolved_model_path() == "intfloat/e5-base-v2"
    assert RetrieverConfig(encoder="e5-base-v2", query_prefix="").prefixes() == ("", "passage: ")


class _EchoEnvironment(SingleToolEnvironment):
    """A new tool environment writes only its tool: here an ``echo`` of its ``text`` argument."""

    tool = function_tool("echo", "Repeat the text.", {"text": {"type": "string"}}, ["text"])

    def _call(self, text: str) -> Observation:
        return Observation(text=text.upper())


def test_single_tool_base_guards_every_step() -> None:
    env = _EchoEnvironment()
    assert isinstance(env, Environment) and env.tool_descriptions() == [_EchoEnvironment.tool]
    with pytest.raises(ValueError, match="before reset"):
        env.step(Action(raw="", tool="echo", arguments={"text": "hi"}))
    env.reset(Task("t", "q"))
    assert env.step(Action(raw="", tool="echo", arguments={"text": "hi"})) == Observation(text="HI")
    assert env.step(Action(raw="", tool="python", arguments={"text": "hi"})) == Observation(
        text="Error: unknown tool 'python'; the only tool is 'echo'.", tool_error=True)
    assert env.step(Action(raw="", tool="echo", arguments={"text": " "})) == Observation(
        text='Error: the echo tool needs a non-empty string argument "text".', tool_error=True)
    assert env.step(parse_action("no action")).text.startswith("Invalid action: no <tool_call>")
    assert env.step(parse_action("<answer>x</answer>")) == Observation(text="", done=True)
    with pytest.raises(TypeError, match="exactly one required argument"):
        type("TwoArgs", (SingleToolEnvironment,), {"tool": function_tool("f", "", {}, ["a", "b"])})


def test_qa_metrics_and_tool_errors(retriever: Retriever) -> None:
    assert normalize_answer("The  Kemu Dynamics!") == "kemu dynamics"
    assert exact_match("the kemu dynamics.", ["Kemu Dynamics"]) == 1.0
    assert exact_match("Kemu", ["Kemu Dynamics", "KD"]) == 0.0 and exact_match("kd", ["Kemu Dynamics", "KD"]) == 1.0
    assert f1_score("Kemu", ["Kemu Dynamics"]) == pytest.approx(2 / 3)
    assert f1_score(None, ["x"]) == 0.0 and exact_match(None, ["x"]) == 0.0
    env = QAEnvironment(retriever, QAEnvConfig(top_k=2, max_passage_chars=20))
    task = Task("q", "Who?", ["Kemu Dynamics"])
    env.reset(task)
    obs = env.step(Action(raw="", tool="search", arguments={"query": "Nivia Thondre employer"}))
    assert obs.text.startswith("[1] Nivia Thondre: ") and obs.text.count("\n") == 1 and " …" in obs.text
    assert env.step(Action(raw="", tool="search", arguments={"query": " "})).tool_error
    assert env.step(Action(raw="", tool="python", arguments={"code": "1"})).tool_error
    actions = [Action(raw="", tool="search", arguments={"query": "x"}), Action(raw="", final_answer="Kemu")]
    metrics = env.metrics(Episode(task, actions, []))
    assert metrics == {"em": 0.0, "f1": pytest.approx(2 / 3), "answered": 1.0, "searches": 1.0}
    snap = env.snapshot()
    other = QAEnvironment(retriever)
    other.restore(snap)
    assert other.snapshot() == snap


# ------------------------------------------------------------------------------------------ random tiny model
def test_random_tiny_model_runs_full_episodes(tiny, qa_factory, kb_data) -> None:
    from trace_core.rollout.hf_engine import HFEngine

    model_dir, tokenizer = tiny
    tasks = [example_to_task(kb_data[1][0])]
    engine = HFEngine(EngineConfig(model_path=str(model_dir), max_model_len=2048, seed=0))
    try:
        agent = AgentConfig(max_turns=3, max_new_tokens=12, max_total_tokens=2048, seed=3)
        result = run_executor(engine, tokenizer, qa_factory, tasks, m=2, n_expand=1, agent=agent)
    finally:
        engine.close()
    (tree,) = result.trees
    tree.validate()
    assert result.stats.trajectories == 2 * (1 + 1)
    assert result.stats.tool_errors == result.stats.turns > 0  # garbage: every turn is an invalid action
    assert {tree.nodes[leaf].depth for leaf in tree.leaves()} == {3}
    assert all(tree.nodes[leaf].reward == 0.0 for leaf in tree.leaves())


# ------------------------------------------------------------------------------------------ fc (BFCL)
def test_bfcl_ground_truth_scores_one_and_a_wrong_trajectory_zero() -> None:
    for task in fc_tasks():
        truth = task.metadata["ground_truth"]
        assert check_call_turns(task, truth)["valid"], task.id
        # The same calls split into one step per call (how the environment records them) pass too.
        assert check_call_turns(task, [list(turn) for turn in truth])["valid"]
        wrong = copy.deepcopy(truth)
        last = max(i for i, t in enumerate(wrong) if t)
        wrong[last] = wrong[last][:-1]  # the last call of the last non-empty turn is missing
        verdict = check_call_turns(task, wrong)
        assert not verdict["valid"] and verdict["error_type"].startswith("multi_turn:"), task.id
        assert not check_call_turns(task, truth[:-1])["valid"]  # stopped before the last turn
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    assert not [k for k in vars(multi_turn_utils) if k.startswith("trace_")]  # checker state cleaned up


def _run_ground_truth(env: FCEnvironment, task: Task) -> tuple[list[Action], list]:
    actions, observations = [], []
    for turn in ground_truth_tool_calls(task):
        for c in turn:
            actions.append(Action(raw="", tool=c["name"], arguments=c["arguments"]))
            observations.append(env.step(actions[-1]))
        actions.append(Action(raw="", final_answer="Done."))
        observations.append(env.step(actions[-1]))
    return actions, observations


def test_bfcl_environment_ground_truth_episode_scores_one() -> None:
    for task in fc_tasks():
        env = FCEnvironment(task)
        env.reset(task)
        actions, observations = _run_ground_truth(env, task)
        assert observations[-1].done and not any(o.done for o in observations[:-1])
        assert env.reward(Episode(task, actions, observations)) == 1.0, env.last_check
        assert [len(t) for t in env.call_turns()] == [len(t) for t in task.metadata["ground_truth"]]


def test_bfcl_user_turns_and_held_out_functions() -> None:
    (task,) = fc_tasks(["multi_turn_miss_func"])
    held_turn, held = next(iter(task.metadata["missed_function"].items()))
    env = FCEnvironment(task)
    names = [t["function"]["name"] for t in env.tool_descriptions()]
    assert names == initial_functions(task) and not set(held) & set(names)
    assert all(t["function"]["parameters"]["type"] == "object" for t in env.tool_descriptions())
    env.reset(task)
    blocked = env.step(Action(raw="", tool=held[0], arguments={}))
    assert blocked.tool_error and "unknown function" in blocked.text
    for turn in range(1, int(held_turn) + 1):
        obs = env.step(Action(raw="", final_answer="ok"))
        assert not obs.done and not obs.tool_error
        if turn < int(held_turn):  # the next user message, verbatim
            assert obs.text == task.metadata["turns"][turn][0]["content"]
        else:  # BFCL's missing-function turn: the held-out docs, then its note
            assert obs.text.endswith("What about now?") and f'"name": "{held[0]}"' in obs.text
    assert held[0] in [t["function"]["name"] for t in env.tool_descriptions()]
    assert env.step(Action(raw="", tool="cd", arguments={"folder": "x", "bad": 1})).tool_error
    # An unfinished episode is force-terminated: reward 0 without running the checker.
    assert env.reward(Episode(task, [], [])) == 0.0
    assert env.last_check["error_type"] == "multi_turn:force_terminated"
    excluded = set(task.metadata["excluded_function"])
    dropped = {t["function"]["name"] for t in
               FCEnvironment(task, FCEnvConfig(drop_excluded_functions=True)).tool_descriptions()}
    assert excluded and excluded <= set(names) and not excluded & dropped


def test_bfcl_prefix_restore_reproduces_backend_state() -> None:
    task = fc_tasks(["multi_turn_base"])[0]
    original = FCEnvironment(task)
    original.reset(task)
    script = [Action(raw="", tool=c["name"], arguments=c["arguments"]) for c in ground_truth_tool_calls(task)[0]]
    script.append(Action(raw="", final_answer="ok"))
    snapshots, states = [], []
    for action in script:
        original.step(action)
        snapshots.append(original.snapshot())
        states.append(copy.deepcopy(original.backend_state()))
    for snap, state in zip(snapshots, states, strict=True):
        for _ in range(2):  # one snapshot can seed several continuations
            fresh = FCEnvironment(task)
            fresh.restore(snap)
            assert fresh.backend_state() == state
            assert fresh.call_turns() == [list(t) for t in snap.calls]
            fresh.step(Action(raw="", tool="mkdir", arguments={"dir_name": "scratch"}))  # mutate the copy
    assert all(isinstance(snap, FCSnapshot) for snap in snapshots)
    # Continuing a restored prefix with the rest of the ground truth still scores 1.
    fresh = FCEnvironment(task)
    fresh.restore(snapshots[-1])
    rest = ground_truth_tool_calls(task)[1:]
    actions = []
    for turn in rest:
        actions += [Action(raw="", tool=c["name"], arguments=c["arguments"]) for c in turn]
        actions.append(Action(raw="", final_answer="ok"))
    observations = [fresh.step(a) for a in actions]
    assert fresh.reward(Episode(task, actions, observations)) == 1.0
    with pytest.raises(ValueError, match="FCSnapshot"):
        fresh.restore({"turn": 0})


def test_bfcl_episodes_of_a_warm_started_policy_have_mixed_rewards(warm_fc_checkpoint: Path) -> None:
    from conftest import WARM_FC_TASKS

    # T = 0.5, not 1: an episode is thousands of tokens over several user turns, and how sharply a
    # two-task fit reproduces them varies with the CPU's float kernels; at T = 1 one derailed token
    # in the tail fails every episode on some machines (all 8 failed on one, with the fit's loss
    # under 0.05), at T = 0.5 the right demonstration is reproduced and the wrong one is not.
    agent = AgentConfig(max_turns=24, max_new_tokens=160, max_total_tokens=8192, temperature=0.5)
    factory = make_env_factory("fc", FCEnvConfig())
    rewards, result = warm_policy_trees(warm_fc_checkpoint, "fc", factory, agent, WARM_FC_TASKS, m=2)
    print("fc rewards", rewards)
    assert set(rewards) == {0.0, 1.0}
    for tree in result.trees:  # the policy's own calls ran on the BFCL backends
        assert any('"name"' in n.info.get("action", "") and not n.info.get("tool_error")
                   for n in tree.nodes), tree.prompt_id


def test_bfcl_episodes_through_the_executor_with_mixed_rewards(tiny) -> None:
    _, tokenizer = tiny
    tasks = fc_tasks(["multi_turn_base", "multi_turn_miss_func"])
    factory = make_env_factory("fc", FCEnvConfig())
    engine = ScriptedEngine(tokenizer, fc_policy({t.id: t for t in tasks}))
    agent = AgentConfig(max_turns=40, max_new_tokens=200, max_total_tokens=200_000)
    result = run_executor(engine, tokenizer, factory, tasks, m=3, n_expand=1, agent=agent)
    rewards = check_trees(result, factory, tasks)
    assert set(rewards) == {0.0, 1.0}
    turns = {t.id: len(t.metadata["turns"]) for t in tasks}
    for tree in result.trees:  # every trajectory went through all user turns, one <answer> each
        for traj in tree.trajectories:
            answers = sum("<answer>" in tree.nodes[n].info["action"] for n in tree.path(traj.leaf)[1:])
            assert answers == turns[tree.prompt_id]


# ------------------------------------------------------------------------------------------ registry
def test_example_to_task_and_factory_arguments(kb_data, qa_factory) -> None:
    from trace_core.data.schema import Example

    qa = example_to_task(kb_data[1][0])
    assert qa.answer == kb_data[1][0].answers and qa.metadata["family"] == "qa" and qa.metadata["path"]
    assert isinstance(qa_factory(qa), Environment) and isinstance(qa_factory(qa), QAEnvironment)
    (fc,) = fc_tasks(["multi_turn_base"])
    assert fc.question == fc.metadata["turns"][0][0]["content"] and fc.metadata["family"] == "fc"
    assert isinstance(make_env_factory("fc")(fc), Environment)
    mc = example_to_task(Example("m1", "math", "arc", "test", "Pick one.", ["B"], ["red", "blue"]))
    assert mc.question == "Pick one.\n\nA. red\nB. blue\n\nAnswer with the letter of the correct option."
    assert answer_is_correct("B", mc)
    with pytest.raises(ValueError, match="reserved"):
        example_to_task(Example("x", "qa", "s", "train", "q", ["a"], metadata={"split": 1}))
    with pytest.raises(ValueError, match="task family 'chess' is not one of math, qa, fc"):
        make_env_factory("chess")
    with pytest.raises(ValueError, match="QAEnvConfig"):
        make_env_factory("qa", FCEnvConfig())
    with pytest.raises(ValueError, match="not a BFCL"):
        FCEnvironment(Task("x", "q")).tool_descriptions()
