"""Spike: does a warm-started QA policy put the question's entity into its first search query?

Greedy first turn on the first 30 questions of a split; a hit when the query minus its last word
(the relation) appears in the question. Measured (session 2, held-out questions): 7/30 untied SFT
(25 view epochs, 200 tasks; 21/30 on training questions), 26/30 tied SFT (8 view epochs, 400 tasks).

    python bench/spikes/first_hop_copy.py POLICY_DIR [test|train]
"""

import json
import re
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trace_core.envs.qa_env import SEARCH_TOOL
from trace_core.rollout.agent import AgentConfig, render_prompt
from trace_core.rollout.env import Task


def main() -> None:
    policy, split = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "test"
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy).eval()
    rows = [json.loads(line) for line in open(f"data/qa/{split}.jsonl")][:30]
    hits = 0
    for r in rows:
        ids = render_prompt(tok, Task(id=r["id"], question=r["prompt"], answer=r["answers"]), [SEARCH_TOOL],
                            AgentConfig())
        out = model.generate(torch.tensor([ids]), max_new_tokens=60, do_sample=False)
        m = re.search(r'"query": "([^"]*)"', tok.decode(out[0, len(ids):]))
        hit = m is not None and m.group(1).rsplit(" ", 1)[0] in r["prompt"]
        hits += hit
        print(hit, "|", r["prompt"], "|", m.group(1) if m else None)
    print(f"first-query entity copied: {hits} / {len(rows)}")


if __name__ == "__main__":
    main()
