"""TRACE's continuations inside verl's rollout (trace_core.integrations.verl_rollout), against the
real verl 0.9.1: its DataProto, its trainer's union and compute_advantage, its agent-loop
registry and ToolAgentLoop, driven by a real tiny policy's generation. What needs verl's Ray
workers and an inference server (the manager's whole step) is examples/verl_trace_gpu.sh's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (importing verl loads its plug-ins: ours among them)
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.ray_trainer import compute_advantage

from trace_core.advantages import tree_advantages
from trace_core.integrations.rows import trajectory_rows
from trace_core.integrations.verl_rollout import (
    CONTINUATION_AGENT,
    HISTORY_KEY,
    AnchorHistory,
    anchor_history,
    attach_continuations,
    bare_counts,
    check_trainer_config,
    continuation_batch,
    merge_rows,
    place_continuations,
    predictor_scorer,
    prompt_groups,
    trees_from_rows,
    turn_spans,
    unpad_rows,
    verl_classes,
)
from trace_core.methods import get_method
from trace_core.predictor.config import PredictorConfig
from trace_core.predictor.success_predictor import SuccessPredictor

P, R = 8, 16  # verl's rollout.prompt_length and response_length in these rows


def rollout_output(rows: list[tuple[list[int], list[int], list[int], float]], uids: list[str]) -> DataProto:
    """A batch laid out as verl's AgentLoopWorker returns it: prompts left-padded to P, responses
    right-padded to R, attention over both, the reward at the last response token (rm_scores)."""
    b = len(rows)
    prompts, responses = torch.zeros((b, P), dtype=torch.long), torch.zeros((b, R), dtype=torch.long)
    attention, mask = torch.zeros((b, P + R), dtype=torch.long), torch.zeros((b, R), dtype=torch.long)
    scores = torch.zeros((b, R), dtype=torch.float32)
    for i, (prompt, response, resp_mask, reward) in enumerate(rows):
        prompts[i, P - len(prompt):] = torch.tensor(prompt)
        attention[i, P - len(prompt):P + len(response)] = 1
        responses[i, :len(response)] = torch.tensor(response)
        mask[i, :len(response)] = torch.tensor(resp_mask)
        scores[i, len(response) - 1] = reward
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "response_mask": mask, "attention_mask": attention,
                 "input_ids": torch.cat([prompts, responses], dim=1),
                 "position_ids": (attention.cumsum(dim=1) - 1).clamp_min(0), "rm_scores": scores},
        non_tensors={"uid": np.array(uids, dtype=object), "data_source": np.array(["toy"] * b, dtype=object)},
        meta_info={"timing": {}, "reward_extra_keys": []})


PROMPT_A, PROMPT_B = [101, 102, 103], [201, 202]
# two turns (a tool call, its observation, an answer), three turns, one turn: per prompt, m = 2 bare
BARE = [
    (PROMPT_A, [5, 6, 7, 40, 41, 8, 9], [1, 1, 1, 0, 0, 1, 1], 0.0),
    (PROMPT_A, [5, 6, 11, 42, 12, 43, 44, 13], [1, 1, 1, 0, 1, 0, 0, 1], 1.0),
    (PROMPT_B, [21, 22], [1, 1], 1.0),
    (PROMPT_B, [21, 23, 50, 24], [1, 1, 0, 1], 0.0),
]


def request_batch(n: int) -> DataProto:
    """verl's request rows of the two prompts: each repeated n times (interleaved), with the
    trainer's string uid."""
    rows = {"raw_prompt": [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
            "uid": ["uid-a", "uid-b"], "data_source": ["toy", "toy"], "agent_name": ["tool_agent", "tool_agent"]}
    base = DataProto.from_dict(non_tensors={k: np.array(v + [None], dtype=object)[:2] for k, v in rows.items()})
    return base.repeat(repeat_times=n, interleave=True)


def test_rows_become_trees_whose_turns_are_a_model_run_and_its_observation() -> None:
    assert turn_spans([1, 1, 1, 0, 0, 1, 1]) == [(0, 5), (5, 7)]
    assert turn_spans([1, 1, 1, 0, 1, 0, 0, 1]) == [(0, 4), (4, 7), (7, 8)]
    rows = unpad_rows(rollout_output(BARE, ["uid-a", "uid-a", "uid-b", "uid-b"]))
    assert rows[0].prompt_ids == PROMPT_A and rows[0].response_ids == BARE[0][1] and rows[1].reward == 1.0
    trees = trees_from_rows(rows, [("uid-a", [0, 1]), ("uid-b", [2, 3])])
    a, b = trees
    assert a.prompt_id == "uid-a" and a.root.token_ids == PROMPT_A
    assert [a.nodes[n].token_ids for n in a.trajectories[0].nodes] == [[5, 6, 7, 40, 41], [8, 9]]
    assert [a.nodes[n].loss_mask for n in a.trajectories[1].nodes] == [[1, 1, 1, 0], [1, 0, 0], [1]]
    assert [a.trajectory_reward(t.id) for t in a.trajectories] == [0.0, 1.0]
    # anchors: the turns that end with an observation, where the model writes its next turn
    assert [anchor_history(a, n).response_ids for n in a.anchors()] == [[5, 6, 7, 40, 41], [5, 6, 11, 42],
                                                                      [5, 6, 11, 42, 12, 43, 44]]
    assert [anchor_history(b, n).response_ids for n in b.anchors()] == [[21, 23, 50]]


def tiny_predictor() -> SuccessPredictor:
    return SuccessPredictor(PredictorConfig(tiny_hidden_size=32, tiny_intermediate_size=64, tiny_max_positions=256))


def planned_step(n: int = 4, expansion_n: int = 1):
    prompts = request_batch(n)
    groups = prompt_groups(prompts.non_tensor_batch["uid"])
    m = bare_counts(groups, expansion_n)
    root_out = rollout_output(BARE, ["uid-a", "uid-a", "uid-b", "uid-b"])
    root_rows = [[0, 1], [2, 3]]
    trees = trees_from_rows(unpad_rows(root_out), [(k, r) for (k, _), r in zip(groups, root_rows, strict=True)])
    method = get_method("trace")
    placements = place_continuations(trees, [method.prefix_budget(k, expansion_n) for k in m], method,
                                     predictor_scorer(tiny_predictor()), np.random.default_rng(0))
    batch, conts = continuation_batch(prompts, [slots[0] for _, slots in groups], trees, placements, "tool_agent")
    return prompts, groups, m, root_out, root_rows, trees, batch, conts


def test_each_continuation_starts_from_its_anchor_s_exact_history() -> None:
    prompts, groups, m, _, _, trees, batch, conts = planned_step()
    assert groups == [("uid-a", [0, 1, 2, 3]), ("uid-b", [4, 5, 6, 7])] and m == [2, 2]
    assert len(batch) == len(conts) == 4  # m·N = 2 continuations per prompt
    assert [sum(c.tree == t for c in conts) for t in (0, 1)] == [2, 2]
    for j, c in enumerate(conts):
        tree = trees[c.tree]
        history = batch.non_tensor_batch[HISTORY_KEY][j]
        assert isinstance(history, AnchorHistory)
        assert history.prompt_ids + history.response_ids == tree.history_tokens(c.branch_node)  # exactly
        assert c.offset == len(history.response_ids) and c.branch_node in tree.anchors()
        assert batch.non_tensor_batch["agent_name"][j] == CONTINUATION_AGENT
        assert batch.non_tensor_batch["uid"][j] == tree.prompt_id  # the prompt's own fields, copied
        assert batch.non_tensor_batch["raw_prompt"][j] == prompts.non_tensor_batch["raw_prompt"][groups[c.tree][1][0]]


def test_a_prompt_without_anchors_gets_fresh_rollouts_with_its_own_agent() -> None:
    prompts = request_batch(2)
    one_turn = [(PROMPT_A, [5, 6], [1, 1], 1.0), (PROMPT_B, [21], [1], 0.0)]
    trees = trees_from_rows(unpad_rows(rollout_output(one_turn, ["uid-a", "uid-b"])), [("uid-a", [0]), ("uid-b", [1])])
    method = get_method("trace")
    placements = place_continuations(trees, [1, 1], method, predictor_scorer(tiny_predictor()),
                                     np.random.default_rng(0))
    assert placements == [[(0, 1)], [(0, 1)]]  # the root, once each
    batch, conts = continuation_batch(prompts, [0, 2], trees, placements, "tool_agent")
    assert batch.non_tensor_batch["agent_name"].tolist() == ["tool_agent", "tool_agent"]
    assert batch.non_tensor_batch[HISTORY_KEY].tolist() == [None, None] and [c.offset for c in conts] == [0, 0]


def continuation_outputs(trees, conts) -> DataProto:
    """What verl's agent loop returns for the continuations: the prompt, then the anchor's history
    and the continuation's own turns (a model turn, an observation, an answer)."""
    rows = []
    for j, c in enumerate(conts):
        h = anchor_history(trees[c.tree], c.branch_node)
        own, own_mask = [60 + j, 61, 70, 62 + j], [1, 1, 0, 1]
        rows.append((h.prompt_ids, h.response_ids + own, h.response_mask + own_mask, float(j % 2)))
    return rollout_output(rows, [trees[c.tree].prompt_id for c in conts])


def test_merged_rows_fit_verl_s_trainer_and_give_the_tree_advantage() -> None:
    prompts, groups, _, root_out, root_rows, trees, _, conts = planned_step()
    cont_out = continuation_outputs(trees, conts)
    trajs = attach_continuations(trees, conts, unpad_rows(cont_out))
    assert [trees[c.tree].trajectories[t].kind for c, t in zip(conts, trajs, strict=True)] == ["continuation"] * 4
    out, issued = merge_rows(groups, trees, root_out, root_rows, cont_out, conts, trajs)
    assert len(out) == len(prompts) and out.batch["responses"].shape == (8, R)  # verl's widths, one row a slot

    # the legacy trainer: its batch (string uid per prompt, repeated) unions the rollout row by row
    # (RLHFDataset gives every row a dummy_tensor; the uid is the trainer's, one per prompt)
    trainer_batch = DataProto.from_dict(tensors={"dummy_tensor": torch.zeros((len(prompts), 1), dtype=torch.uint8)},
                                        non_tensors={"uid": prompts.non_tensor_batch["uid"].copy(),
                                                     "data_source": prompts.non_tensor_batch["data_source"].copy()})
    batch = trainer_batch.union(out)
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    from trace_core.integrations.verl import issue_row_ids

    issue_row_ids(issued)
    got = compute_advantage(batch, adv_estimator="trace_tree",
                            config=AlgoConfig(adv_estimator="trace_tree")).batch["advantages"]

    rows = trajectory_rows(trees, [tree_advantages(t) for t in trees])
    want = {(trees[r.tree].prompt_id, r.trajectory): r for r in rows}
    assert sum(abs(r.advantages).sum() for r in rows) > 0  # mixed groups: a comparison that can fail
    slot_rows = {s: rid for key, slots in groups for s, rid in zip(slots, issued[key], strict=True)}
    assert sorted(slot_rows) == list(range(len(out)))
    for slot, rid in slot_rows.items():
        assert batch.non_tensor_batch["uid"][slot] == rid.key
        row = want[(rid.key, rid.trajectory)]
        h, n = rid.offset, len(row.advantages)
        mask = batch.batch["response_mask"][slot]
        assert not mask[:h].any()  # the anchor's shared history is trained on its bare row only
        assert mask[h:h + n].tolist() == row.tool_mask
        assert torch.allclose(got[slot, h:h + n], torch.tensor(row.advantages, dtype=got.dtype), atol=1e-6)
        assert not got[slot, :h].any() and not got[slot, h + n:].any()


def test_a_continuation_that_lost_its_history_is_refused() -> None:
    _, _, _, _, _, trees, _, conts = planned_step()
    out = continuation_outputs(trees, conts)
    out.batch["responses"][0, 0] += 1  # its first history token is not the anchor's
    with pytest.raises(ValueError, match="does not start with its anchor's exact history"):
        attach_continuations(trees, conts, unpad_rows(out))


def test_the_manager_refuses_trainer_settings_its_rows_cannot_live_with() -> None:
    from omegaconf import OmegaConf

    ok = {"trainer": {"use_v1": False, "balance_batch": False}, "algorithm": {"adv_estimator": "trace_tree"}}
    check_trainer_config(OmegaConf.create(ok))
    for key, value, words in [("trainer", {"use_v1": True}, "use_v1=false"),
                              ("trainer", {"use_v1": False, "balance_batch": True}, "balance_batch=false"),
                              ("algorithm", {"adv_estimator": "grpo"}, "adv_estimator=trace_tree")]:
        with pytest.raises(ValueError, match=words):
            check_trainer_config(OmegaConf.create({**ok, key: value}))
    with pytest.raises(ValueError, match="multiple of 1 \\+ N"):
        bare_counts(prompt_groups(["u"] * 3), 1)


class TinyServer:
    """verl's LLM-server contract (``generate`` -> TokenOutput) answered by a real tiny Qwen3's
    ``transformers`` generation; it records each request's prompt tokens."""

    def __init__(self, model, new_tokens: int = 6) -> None:
        self.model, self.new_tokens, self.requests, self.answers = model, new_tokens, [], []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.requests.append(list(prompt_ids))
        torch.manual_seed(len(self.requests))
        with torch.no_grad():
            out = self.model.generate(torch.tensor([prompt_ids]), max_new_tokens=self.new_tokens, do_sample=True,
                                      output_scores=True, return_dict_in_generate=True, pad_token_id=0)
        ids = out.sequences[0, len(prompt_ids):].tolist()
        logp = [float(torch.log_softmax(s[0], -1)[t]) for s, t in zip(out.scores, ids, strict=True)]
        self.answers.append((ids, logp))
        return TokenOutput(token_ids=ids, log_probs=logp)


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_core.models import TinyQwen3Config, build_tiny_qwen3

    path = build_tiny_qwen3(Path(tmp_path_factory.mktemp("policy")), TinyQwen3Config(seed=0))
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_the_continuation_agent_loop_generates_from_the_anchor_s_exact_tokens(tiny_policy) -> None:
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    model, tokenizer = tiny_policy
    verl_classes()
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": 64, "response_length": 48, "full_determinism": False,
        "multi_turn": {"max_user_turns": 4, "max_assistant_turns": 4, "max_parallel_calls": 1,
                       "max_tool_response_length": 256, "tool_response_truncate_side": "middle",
                       "format": "hermes"}}}})
    server = TinyServer(model)
    messages = [{"role": "user", "content": "what is two plus two"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    obs = tokenizer.encode("<|im_end|>\n<|im_start|>user\n<tool_response>4</tool_response><|im_end|>\n"
                           "<|im_start|>assistant\n")
    first_turn = [int(t) for t in server.model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False,
                                                        pad_token_id=0)[0, len(prompt):]]
    history = AnchorHistory(prompt, first_turn + obs, [1] * len(first_turn) + [0] * len(obs),
                            [-0.5] * len(first_turn) + [0.0] * len(obs))

    async def worker_runs_one_sample():
        # as verl's AgentLoopWorker runs a sample: its loop from the registry by the row's agent_name,
        # built inside the worker's event loop, then run with the row's fields
        loop = hydra.utils.instantiate(_agent_loop_registry[CONTINUATION_AGENT], trainer_config=DictConfigWrap(config),
                                       server_manager=server, tokenizer=tokenizer, processor=None,
                                       hf_model_type="qwen3", dataset_cls=RLHFDataset,
                                       data_config=DictConfigWrap(OmegaConf.create({})), tools=ToolListWrap([]))
        return await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True},
                              raw_prompt=messages, **{HISTORY_KEY: history})

    out = asyncio.run(worker_runs_one_sample())

    h = len(history.response_ids)
    assert server.requests[0] == prompt + history.response_ids  # generated from the exact token history
    assert out.prompt_ids == prompt  # verl's row: the prompt, then the whole response
    assert out.response_ids[:h] == history.response_ids and out.response_mask[:h] == history.response_mask
    ids, logp = server.answers[0]  # its own first turn: the policy's tokens, trained on, with their log-probs
    assert out.response_ids[h:h + len(ids)] == ids and out.response_mask[h:h + len(ids)] == [1] * len(ids)
    assert out.response_logprobs[:h] == history.response_logprobs
    assert out.response_logprobs[h:h + len(ids)] == pytest.approx(logp)
    assert out.num_turns >= 3  # the history's assistant and tool turns count, then its own
