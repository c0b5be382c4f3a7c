"""The warm start end to end: expert scripts -> tokenizer + random tiny Qwen3 -> demonstrations
-> SFT in two stages -> success rate per task family.

SFT stage 1 trains on turn views (each model turn with only its immediate input as context,
:class:`~trace_core.warmstart.demos.TurnView`): cheap sequences where copying numbers and names
is most of the signal. Stage 2 trains on the full demonstrations, the exact token sequences the
executor produces. Both put the loss on model-written tokens only.

    out/init/          the random policy and the tokenizer trained on the demonstration corpus
    out/demos.jsonl    the rendered demonstrations (texts, token ids, loss masks)
    out/views/         the policy after stage 1
    out/policy/        the fine-tuned policy (save_pretrained: transformers and vLLM load it)
    out/qa_index/      the QA retriever index, built here when none is given
    out/report.json    sizes, SFT time and loss, corruption rates, success rates
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_core.envs.math_env import PYTHON_TOOL
from trace_core.envs.qa_env import SEARCH_TOOL
from trace_core.models import TinyQwen3Config
from trace_core.rollout.agent import AgentConfig
from trace_core.rollout.env import Task
from trace_core.warmstart.demos import (
    DemoConfig,
    ToolSchemas,
    build_scripts,
    corruption_rate,
    load_tasks,
    render_demos,
    write_demos,
)
from trace_core.warmstart.evaluate import TABLE_HEADER, FamilySuccess, WarmStartEvalConfig, evaluate_policy
from trace_core.warmstart.experts import Expert, FCExpert, MathExpert, QAExpert, Script, load_kb
from trace_core.warmstart.policy import WARM_MODEL, build_policy, count_parameters, tokenizer_corpus
from trace_core.warmstart.sft import SFTConfig, SFTLog, read_sft_log, sft
from trace_core.warmstart.testbed import TestbedConfig
from trace_core.warmstart.tools import PassageSearch, load_passages

FAMILIES = ("math", "qa", "fc")  # task families with a scripted expert
DEFAULT_FAMILIES = ("math", "qa")  # BFCL demonstrations are ~4k-token sequences: opt in
# Stage 1 learns the copying skills on cheap turn views (demos.TurnView), stage 2 the full format.
VIEW_SFT = SFTConfig(lr=5e-3, epochs=5.0, batch_size=32, warmup_steps=10, share_prefix=False, tie_embeddings=True)
FULL_SFT = SFTConfig(lr=3e-3, epochs=1.0, batch_size=8, warmup_steps=5, tie_embeddings=True)
# The testbed's recipe: the policy must reproduce its demonstrations at T = 1 (known topics
# always right, unknown ones always wrong), so full demonstrations only, many passes.
TESTBED_SFT = SFTConfig(lr=5e-3, epochs=80.0, batch_size=16, warmup_steps=10, tie_embeddings=True)
# The tool schemas each family's environment puts in the prompt (its tool_descriptions()).
TOOLS: dict[str, list[dict[str, Any]]] = {"math": [PYTHON_TOOL], "qa": [SEARCH_TOOL]}


def bfcl_tools(task: Task) -> list[dict[str, Any]]:
    """The tools a BFCL entry's prompt lists: its involved classes' functions (missing-function
    entries without the held-out ones), as the environment offers them at reset."""
    from trace_core.envs.fc_env import FCEnvironment

    return FCEnvironment(task).tool_descriptions()


def family_tools(family: str) -> ToolSchemas:
    return bfcl_tools if family == "fc" else TOOLS[family]


@dataclass(frozen=True)
class WarmStartConfig:
    """Everything one warm start depends on."""

    data_dir: str = "data"  # output of `python -m trace_core.data.generate`
    out_dir: str = "runs/warm"
    families: tuple[str, ...] = DEFAULT_FAMILIES  # task families to demonstrate and evaluate (of FAMILIES)
    train_tasks: int | None = None  # demonstrate only the first N training tasks per family (None: all)
    train_task_ids: tuple[str, ...] = ()  # if set: demonstrate exactly these training tasks (ids), not the first N
    eval_tasks: int = 50  # evaluate on the first N test tasks per family (0: skip evaluation)
    # "test": held-out skill; "train": the demonstrated tasks themselves, i.e. the success an RL run
    # on them starts from (the first eval_tasks of train_task_ids / the training file)
    eval_split: str = "test"
    qa_index: str | None = None  # retriever index for QA evaluation; None: build one under out_dir
    demos: DemoConfig = field(default_factory=DemoConfig)
    model: TinyQwen3Config = WARM_MODEL
    copy_init: bool = True  # policy.copy_friendly_init on the random model
    view_sft: SFTConfig | None = field(default_factory=lambda: VIEW_SFT)  # stage 1, on turn views; None: skip
    sft: SFTConfig = field(default_factory=lambda: FULL_SFT)  # stage 2, on the full demonstrations
    eval: WarmStartEvalConfig = field(default_factory=WarmStartEvalConfig)
    # Observations from the real environments (math: the sandbox; QA: the dense retriever over
    # qa_index, built if missing) instead of the experts' cheap stand-ins: demonstrations are then
    # byte for byte what a rollout of the same actions sees, at the tools' cost. A policy fitted to
    # stand-in observations drifts as soon as the retriever ranks passages differently.
    real_observations: bool = False
    agent: AgentConfig = field(default_factory=AgentConfig)
    # BFCL episodes: several user turns of several calls each, after a ~3-10k-token prompt.
    fc_agent: AgentConfig = field(default_factory=lambda: AgentConfig(max_turns=40, max_new_tokens=200,
                                                                      max_total_tokens=32_768))
    # QA demonstrations over other, freshly generated knowledge bases (same generator, other seeds,
    # other made-up names). On the task KB alone a tiny policy memorises which entity goes with
    # which question; names it has never seen can only be copied, which is the skill a new
    # question needs. 0: only the task KB.
    synthetic_kbs: int = 0
    synthetic_questions: int = 200  # questions per synthetic knowledge base
    # The embedded testbed (trace_core.warmstart.testbed): QA demonstrations follow its plan —
    # topics known, unknown or partial — over its pool and warm-up split instead of the first
    # train_tasks questions, with real observations; writes pool.jsonl, warmup.jsonl, testbed.json.
    testbed: TestbedConfig | None = None
    # A folder of fine-tuned policies kept by the inputs that made them (trace_core.warmstart.sft_cache):
    # a warm start whose starting model, demonstrations and SFT settings match an entry copies its
    # policy instead of fine-tuning. None: always fine-tune.
    sft_cache: str | None = None
    keep_sft: bool = False  # add a fresh SFT's policy to sft_cache (which is then required)

    def __post_init__(self) -> None:
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown or not self.families:
            raise ValueError(f"families must be a non-empty subset of {FAMILIES}, got {self.families}")
        if self.train_tasks is not None and self.train_tasks < 1:
            raise ValueError(f"train_tasks must be >= 1 or None, got {self.train_tasks}")
        if self.eval_tasks < 0:
            raise ValueError(f"eval_tasks must be >= 0, got {self.eval_tasks}")
        if self.eval_split not in ("test", "train"):
            raise ValueError(f"eval_split must be 'test' or 'train', got {self.eval_split!r}")
        if self.keep_sft and self.sft_cache is None:
            raise ValueError("keep_sft needs sft_cache: the folder to add the fine-tuned policy to")
        if self.testbed is not None and "qa" not in self.families:
            raise ValueError(f"testbed needs the qa family among families, got {self.families}")
        if self.synthetic_kbs < 0 or self.synthetic_questions < 1:
            raise ValueError(f"synthetic_kbs must be >= 0 and synthetic_questions >= 1, got "
                             f"{self.synthetic_kbs}, {self.synthetic_questions}")

    def agent_for(self, family: str) -> AgentConfig:
        """The agent settings a family's demonstrations and rollouts use."""
        return self.fc_agent if family == "fc" else self.agent


def make_expert(family: str, data_dir: str | Path) -> Expert:
    """The scripted expert of a task family, with the stand-in tools over ``data_dir``."""
    data = Path(data_dir)
    if family == "math":
        return MathExpert()
    if family == "fc":
        return FCExpert()
    if family == "qa":
        return QAExpert(load_kb(data / "qa" / "kb.json"), PassageSearch(load_passages(data / "qa" / "corpus.jsonl")))
    raise ValueError(f"no scripted expert for task family {family!r}; known: {FAMILIES}")


SYNTHETIC_KB_SEED = 1_000  # synthetic knowledge base i uses KBConfig(seed=SYNTHETIC_KB_SEED + i)


def synthetic_qa_scripts(count: int, questions: int, demos: DemoConfig) -> tuple[list[Script], list]:
    """Expert scripts over ``count`` freshly generated knowledge bases, and their passages."""
    from trace_core.data.kb import KBConfig, build_kb, corpus, generate_questions
    from trace_core.envs.registry import example_to_task
    from trace_core.warmstart.experts import KBEntity

    scripts: list[Script] = []
    passages: list = []
    for i in range(count):
        config = KBConfig(seed=SYNTHETIC_KB_SEED + i)
        kb = build_kb(config)
        kb_passages = corpus(kb)
        examples = generate_questions(kb, f"synthetic{i}", questions, config, set())
        expert = QAExpert({e.id: KBEntity(e.id, e.kind, e.name, e.attrs) for e in kb.values()},
                          PassageSearch(kb_passages))
        scripts += build_scripts(expert, [example_to_task(e) for e in examples], demos)
        passages += kb_passages
    return scripts, passages


def training_tasks(config: WarmStartConfig, family: str) -> list[Task]:
    """The training tasks of ``family`` to demonstrate: ``train_task_ids`` if set, else the first
    ``train_tasks`` (all if None) of ``data_dir/<family>/train.jsonl``."""
    tasks = load_tasks(Path(config.data_dir) / family / "train.jsonl",
                       None if config.train_task_ids else config.train_tasks)
    if config.train_task_ids:
        tasks = [t for t in tasks if t.id in set(config.train_task_ids)]
        if not tasks:
            raise ValueError(f"train_task_ids names no {family} training task; drop {family!r} from families "
                             "or add one of its ids")
    return tasks


def env_factory(family: str, data_dir: str | Path, qa_index: str | Path):
    """The real environment factory of ``family`` for the warm start's demonstrations: a family that
    reads an index reads ``qa_index`` (built from its corpus under ``data_dir`` if missing)."""
    from trace_core.envs.registry import family_env_factory

    return family_env_factory(family, data_dir=data_dir, index_dir=qa_index, quiet=False)


def build_testbed(config: WarmStartConfig, out: Path) -> list[Script]:
    """Draw the testbed from the QA training split, write its two question files and its plan
    under ``out``, and return the plan's scripts (observed through the real retriever)."""
    from trace_core.warmstart.testbed import (
        draw_testbed,
        read_rows,
        testbed_scripts,
        warm_start_code_digest,
        write_split,
    )

    assert config.testbed is not None
    data = Path(config.data_dir)
    rows, md5 = read_rows(data / "qa" / "train.jsonl")
    testbed = draw_testbed(rows, config.testbed, md5)
    write_split(rows, testbed.pool, out / "pool.jsonl")
    write_split(rows, testbed.warmup, out / "warmup.jsonl")
    (out / "testbed.json").write_text(json.dumps({**testbed.to_json(), "warm_start_code": warm_start_code_digest()},
                                                 indent=1) + "\n")
    tasks = load_tasks(out / "pool.jsonl", None) + load_tasks(out / "warmup.jsonl", None)
    factory = env_factory("qa", data, config.qa_index or out / "qa_index")  # the testbed is a QA pool
    scripts = testbed_scripts(testbed, tasks, make_expert("qa", data), factory)
    print(f"testbed {testbed.hash}: {len(testbed.pool)} pool + {len(testbed.warmup)} warm-up questions, "
          f"{len(scripts)} demonstrations ({sum(not s.correct for s in scripts)} wrong)")
    return scripts


def run_warm_start(config: WarmStartConfig) -> dict[str, Any]:
    """Run the whole warm start (module docstring); returns the report that is also written."""
    from transformers import AutoTokenizer

    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(config.data_dir)
    t0 = time.perf_counter()
    scripts: dict[str, list[Script]] = {}
    for family in config.families:
        if family == "qa" and config.testbed is not None:
            scripts["qa"] = build_testbed(config, out)
            continue
        factory = None
        if config.real_observations:
            factory = env_factory(family, data, config.qa_index or out / "qa_index")
        scripts[family] = build_scripts(make_expert(family, data), training_tasks(config, family), config.demos,
                                        factory)
    passages = load_passages(data / "qa" / "corpus.jsonl") if "qa" in config.families else []
    if "qa" in config.families and config.synthetic_kbs:
        extra, extra_passages = synthetic_qa_scripts(config.synthetic_kbs, config.synthetic_questions, config.demos)
        scripts["qa"] = scripts["qa"] + extra
        passages = passages + extra_passages
    corpus = tokenizer_corpus(scripts, {f: family_tools(f) for f in scripts}, config.agent, passages)
    init_dir = build_policy(out / "init", corpus, config.model, copy_init=config.copy_init)
    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    demos = []
    for family in config.families:
        agent = config.agent_for(family)
        limit = agent.max_total_tokens if family == "fc" else config.demos.max_tokens
        demos += render_demos(tokenizer, scripts[family], family_tools(family), agent, limit)
    for demo in demos:  # SFT would silently cut a longer one (an FC demo's calls come after its long prompt)
        if len(demo.token_ids) > config.sft.max_length:
            raise ValueError(f"demo of task {demo.script.task.id!r} has {len(demo.token_ids)} tokens, over "
                             f"sft.max_length={config.sft.max_length}; raise sft.max_length")
    write_demos(out / "demos.jsonl", demos)
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    views = [v for d in demos for v in d.turn_views(im_start)]
    prep_seconds = time.perf_counter() - t0
    print(f"{len(demos)} demonstrations ({sum(len(d.token_ids) for d in demos)} tokens, {len(views)} turn views) "
          f"and a {len(tokenizer)}-token tokenizer in {prep_seconds:.1f} s")
    stages, policy_dir, key, reused = fine_tune(config, init_dir, out, views, demos)
    report: dict[str, Any] = {
        "config": asdict(config),
        "tokenizer_size": len(tokenizer),
        "parameters": count_parameters(policy_dir),
        "demos": {f: {"count": len(s), "corrupted_step_rate": corruption_rate(s),
                      "correct_rate": sum(x.correct for x in s) / len(s)} for f, s in scripts.items()},
        "demo_tokens": sum(len(d.token_ids) for d in demos),
        "prep_seconds": prep_seconds,
        "sft": {name: {"steps": log.steps, "wall_seconds": log.wall_seconds, "cpu_seconds": log.cpu_seconds,
                       "first_loss": log.losses[0], "last10_loss": sum(log.losses[-10:]) / len(log.losses[-10:]),
                       "processed_tokens": log.processed_tokens, "target_tokens": log.target_tokens}
                for name, log in stages},
        "policy_dir": str(policy_dir),
        "sft_cache": {"key": key, "reused": reused},
        "eval": {},
    }
    for name, log in stages:
        print(f"SFT {name}: {log.steps} steps in {log.wall_seconds:.1f} s wall / {log.cpu_seconds:.1f} s CPU, "
              f"loss {log.losses[0]:.3f} -> {report['sft'][name]['last10_loss']:.3f} (mean of the last 10 steps)")
    total = sum(log.wall_seconds for _, log in stages), sum(log.cpu_seconds for _, log in stages)
    report["sft_total"] = {"wall_seconds": total[0], "cpu_seconds": total[1]}
    if config.eval_tasks:
        results = evaluate_families(config, policy_dir)
        report["eval"] = {r.family: asdict(r) for r in results}
        print(TABLE_HEADER)
        for r in results:
            print(r.row())
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report


VIEWS_LOG = "views_sft_log.json"  # the turn-view stage's log in an SFT cache entry


def fine_tune(config: WarmStartConfig, init_dir: Path, out: Path, views: list, demos: list
              ) -> tuple[list[tuple[str, SFTLog]], Path, str, bool]:
    """The SFT stages (turn views, then full demonstrations) from ``init_dir`` into ``out/policy``,
    or their result from ``config.sft_cache`` when an entry was made from the same starting model,
    demonstrations (``out/demos.jsonl``) and settings (:mod:`trace_core.warmstart.sft_cache`).
    Returns each stage's log, the policy folder, the inputs' key and whether the cache served it."""
    from trace_core.warmstart import sft_cache

    key = sft_cache.sft_key(init_dir, out / "demos.jsonl", [config.view_sft, config.sft])
    logs = [VIEWS_LOG] if config.view_sft is not None else []
    if config.sft_cache is not None and sft_cache.restore(config.sft_cache, key, out, logs):
        print(f"SFT: the policy fine-tuned from these inputs is in {config.sft_cache}/{key}; reused")
        stages = [("views", SFTLog(**json.loads((out / VIEWS_LOG).read_text())))] if logs else []
        return [*stages, ("full", read_sft_log(out / "policy"))], out / "policy", key, True
    stages = []
    start_dir = init_dir
    if config.view_sft is not None:
        start_dir = sft(init_dir, views, config.view_sft, out_dir=out / "views")
        stages.append(("views", read_sft_log(start_dir)))
    policy_dir = sft(start_dir, demos, config.sft, out_dir=out / "policy")
    stages.append(("full", read_sft_log(policy_dir)))
    if config.keep_sft:
        sft_cache.keep(config.sft_cache, key, policy_dir,
                       {VIEWS_LOG: start_dir / "sft_log.json"} if config.view_sft is not None else {},
                       {"demonstrations": len(demos), "demo_tokens": sum(len(d.token_ids) for d in demos),
                        "view_sft": config.view_sft, "sft": config.sft})
    return stages, policy_dir, key, False


def evaluate_families(config: WarmStartConfig, policy_dir: str | Path) -> list[FamilySuccess]:
    """Success rate per family on the first ``config.eval_tasks`` tasks of ``config.eval_split``
    (training: those demonstrated), with the real environments."""
    data = Path(config.data_dir)
    results = []
    for family in config.families:
        index = config.qa_index or Path(config.out_dir) / "qa_index"
        if config.eval_split == "train" and family == "qa" and config.testbed is not None:
            tasks = load_tasks(Path(config.out_dir) / "pool.jsonl", config.eval_tasks)
        elif config.eval_split == "train":
            tasks = training_tasks(config, family)[: config.eval_tasks]
        else:
            tasks = load_tasks(data / family / "test.jsonl", config.eval_tasks)
        results.append(evaluate_policy(policy_dir, family, tasks, env_factory(family, data, index),
                                       config.agent_for(family), config.eval))
    return results
