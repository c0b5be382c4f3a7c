"""An engine adapter for the greedy pass: every temperature-0 history is decoded once.

The executor samples groups of at least two trajectories per prompt (one request with ``n >= 2``),
but vLLM rejects ``n > 1`` at temperature 0, and decoding the same greedy history twice would
be waste anyway. :class:`GreedyOnce` sits between the executor and the engine:

* a temperature-0 request with ``n > 1`` goes to the engine as one ``n = 1`` request, and its
  sample is repeated ``n`` times in the completion handed back;
* a temperature-0 request whose history and sampling settings (the seed aside: greedy ignores
  it) match one already decoded or in flight is answered from that one — the group's identical
  trajectories reach identical next turns;
* requests at temperature > 0 pass through untouched.

So a greedy group of ``m`` trajectories costs one decode per turn; the environments still run
each trajectory's actions (they are identical, so their rewards are too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from trace_core.rollout.engine import Completion, GenerationRequest, RolloutEngine, SamplingConfig, WeightsSource

_Key = tuple[tuple[int, ...], SamplingConfig]


class GreedyOnce:
    """A :class:`~trace_core.rollout.engine.RolloutEngine` over ``engine`` (see the module docstring)."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self._key_of: dict[str, _Key] = {}  # inner request id -> history key
        self._waiting: dict[_Key, list[GenerationRequest]] = {}  # requests waiting on an in-flight decode
        self._decoded: dict[_Key, Completion] = {}
        self._ready: list[Completion] = []
        self._outstanding = 0  # requests submitted here and not yet handed back
        self._next_id = 0
        self.decoded = 0  # greedy requests sent to the engine
        self.reused = 0  # greedy requests answered without decoding

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        for req in requests:
            self._outstanding += 1
            if req.sampling.temperature != 0:
                self.engine.submit([req])
                continue
            key = (req.prompt_token_ids, dataclasses.replace(req.sampling, n=1, seed=None))
            if key in self._decoded:
                self.reused += 1
                self._ready.append(_repeat(req, self._decoded[key]))
            elif key in self._waiting:
                self.reused += 1
                self._waiting[key].append(req)
            else:
                inner = f"greedy-once-{self._next_id}"
                self._next_id += 1
                self._key_of[inner] = key
                self._waiting[key] = [req]
                self.decoded += 1
                self.engine.submit([GenerationRequest(inner, req.prompt_token_ids, key[1])])

    def poll(self) -> list[Completion]:
        out, self._ready = self._ready, []
        if self.engine.num_pending:
            for completion in self.engine.poll():
                key = self._key_of.pop(completion.request_id, None)
                if key is None:
                    out.append(completion)
                    continue
                self._decoded[key] = completion
                out += [_repeat(req, completion) for req in self._waiting.pop(key)]
        self._outstanding -= len(out)
        return out

    @property
    def num_pending(self) -> int:
        return self._outstanding

    def load_weights(self, weights: WeightsSource) -> None:
        self._decoded.clear()  # decodes of the old weights are no answer for the new ones
        self.engine.load_weights(weights)

    def close(self) -> None:
        self.engine.close()


def _repeat(request: GenerationRequest, decoded: Completion) -> Completion:
    """``decoded``'s one sample, ``request.sampling.n`` times, under the request's id."""
    return Completion(request_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
                      samples=decoded.samples[:1] * request.sampling.n, num_cached_tokens=decoded.num_cached_tokens,
                      step=decoded.step)
