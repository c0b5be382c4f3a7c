"""The reference rollout engine: plain transformers, one KV cache per sample, no batching tricks.

It exists to check vLLM, not to be fast: every sample keeps its own ``DynamicCache`` and each
:meth:`HFEngine.poll` decodes one token for every active sample, so requests still finish (and are
delivered) independently, in the order their samples end. Log-probs are computed the obvious way
(``log_softmax`` of the logits), and :func:`teacher_forced_logprobs` scores a given completion.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_core.rollout.engine import (
    Completion,
    EngineConfig,
    GenerationRequest,
    Sample,
    SamplingConfig,
    WeightsSource,
    check_new_requests,
)


@dataclass
class _SampleState:
    generator: Any  # torch.Generator of this sample
    cache: Any = None  # DynamicCache once the prompt is prefilled
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    text: str = ""


@dataclass
class _RequestState:
    request: GenerationRequest
    samples: list[_SampleState]


class HFEngine:
    """:class:`~trace_core.rollout.engine.RolloutEngine` on a transformers causal LM (the reference)."""

    def __init__(self, config: EngineConfig) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not Path(config.model_path).is_dir():
            raise ValueError(f"model_path must be a local model directory, got {config.model_path!r}")
        model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=getattr(torch, config.dtype))
        model.eval()
        self._start(config, model, AutoTokenizer.from_pretrained(config.model_path), model.generation_config)

    @classmethod
    def on_model(cls, config: EngineConfig, model: Any, tokenizer: Any, generation_config: Any) -> HFEngine:
        """The engine on a model already in memory (``model(input_ids=...)`` returns ``.logits``),
        read in place: a trainer's live policy samples from its current weights, nothing copied.
        ``config.model_path`` only names it."""
        engine = cls.__new__(cls)
        engine._start(config, model, tokenizer, generation_config)
        return engine

    def _start(self, config: EngineConfig, model: Any, tokenizer: Any, generation_config: Any) -> None:
        import torch

        self.config = config
        self._torch = torch
        self.model = model
        self.tokenizer = tokenizer
        eos = generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos_ids)
        self._seed_source = torch.Generator().manual_seed(config.seed)
        self._active: dict[str, _RequestState] = {}
        self._steps = 0
        self._closed = False

    # -- RolloutEngine -------------------------------------------------------------------------

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        self._check_open()
        check_new_requests(requests, set(self._active), self.config.max_model_len)
        torch = self._torch
        for req in requests:
            states = []
            for i in range(req.sampling.n):
                if req.sampling.seed is None:
                    seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
                else:
                    seed = req.sampling.seed + i  # vLLM's rule for the i-th of n samples
                states.append(_SampleState(generator=torch.Generator().manual_seed(seed)))
            self._active[req.request_id] = _RequestState(req, states)

    def poll(self) -> list[Completion]:
        self._check_open()
        if not self._active:
            return []
        self._steps += 1
        done = []
        for rid, state in list(self._active.items()):
            for sample in state.samples:
                if sample.finish_reason is None:
                    self._decode_one(state.request, sample)
            if all(s.finish_reason is not None for s in state.samples):
                del self._active[rid]
                done.append(self._completion(state))
        return done

    @property
    def num_pending(self) -> int:
        return len(self._active)

    def load_weights(self, weights: WeightsSource) -> None:
        self._check_open()
        if self._active:
            raise ValueError(f"load_weights needs an idle engine; {len(self._active)} requests are pending")
        if isinstance(weights, Mapping):
            state = dict(weights)
            if not state:
                raise ValueError("weights must not be an empty state dict")
        else:
            from transformers import AutoModelForCausalLM

            path = Path(weights)
            if not path.is_dir():
                raise ValueError(f"weights must be a state dict or a model directory, got {str(path)!r}")
            state = AutoModelForCausalLM.from_pretrained(path, dtype=self.model.dtype).state_dict()
        with self._torch.no_grad():
            self.model.load_state_dict(state, strict=True)

    def close(self) -> None:
        self._closed = True
        self._active.clear()

    # -- extras --------------------------------------------------------------------------------

    def score(self, prompt_token_ids: Sequence[int], completion_token_ids: Sequence[int]) -> list[float]:
        """Teacher-forced raw log-probs of ``completion_token_ids`` after ``prompt_token_ids``."""
        self._check_open()
        return teacher_forced_logprobs(self.model, prompt_token_ids, completion_token_ids)

    def _decode_one(self, req: GenerationRequest, sample: _SampleState) -> None:
        torch = self._torch
        from transformers import DynamicCache

        s = req.sampling
        with torch.no_grad():
            if sample.cache is None:
                sample.cache = DynamicCache(config=self.model.config)
                inputs = list(req.prompt_token_ids)
            else:
                inputs = sample.token_ids[-1:]
            out = self.model(input_ids=torch.tensor([inputs]), past_key_values=sample.cache, use_cache=True)
            logits = out.logits[0, -1].float()
        raw = torch.log_softmax(logits, dim=-1)
        if s.temperature == 0:
            token = int(torch.argmax(logits))
            processed = raw
        else:
            processed = _nucleus_logprobs(logits / s.temperature, s.top_p)
            token = int(torch.multinomial(processed.exp(), 1, generator=sample.generator))
        reported = raw if self.config.logprobs_mode == "raw_logprobs" else processed
        sample.token_ids.append(token)
        sample.logprobs.append(float(reported[token]))
        self._check_stop(s, sample)

    def _check_stop(self, s: SamplingConfig, sample: _SampleState) -> None:
        token = sample.token_ids[-1]
        text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        matches = [(text.find(stop), stop) for stop in s.stop if stop in text]
        if matches:
            pos, stop = min(matches)
            sample.finish_reason, sample.stop_reason = "stop", stop
            sample.text = text[: pos + len(stop)] if s.include_stop_str_in_output else text[:pos]
            return
        sample.text = text
        if token in s.stop_token_ids:
            sample.finish_reason, sample.stop_reason = "stop", token
        elif not s.ignore_eos and token in self.eos_token_ids:
            sample.finish_reason = "stop"
        elif len(sample.token_ids) >= s.max_new_tokens:
            sample.finish_reason = "length"

    def _completion(self, state: _RequestState) -> Completion:
        samples = tuple(
            Sample(token_ids=tuple(x.token_ids), logprobs=tuple(x.logprobs), finish_reason=x.finish_reason,
                   stop_reason=x.stop_reason, text=x.text)
            for x in state.samples
        )
        return Completion(request_id=state.request.request_id, prompt_token_ids=state.request.prompt_token_ids,
                          samples=samples, num_cached_tokens=None, step=self._steps)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the engine is closed")


def _nucleus_logprobs(logits, top_p: float):
    """Log-probs after top-p filtering: tokens outside the smallest set with mass >= top_p get -inf."""
    import torch

    logprobs = torch.log_softmax(logits, dim=-1)
    if top_p >= 1.0:
        return logprobs
    sorted_lp, order = torch.sort(logprobs, descending=True)
    mass_before = torch.cumsum(sorted_lp.exp(), dim=-1) - sorted_lp.exp()
    drop = mass_before >= top_p  # the first token always stays
    filtered = logits.clone()
    filtered[order[drop]] = float("-inf")
    return torch.log_softmax(filtered, dim=-1)


def teacher_forced_logprobs(model, prompt_token_ids: Sequence[int], completion_token_ids: Sequence[int]) -> list[float]:
    """Raw log-probs ``log p(c_j | prompt, c_<j)`` of a completion, from one forward pass."""
    import torch

    if not prompt_token_ids:
        raise ValueError("prompt_token_ids must not be empty")
    if not completion_token_ids:
        return []
    ids = list(prompt_token_ids) + list(completion_token_ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt_token_ids) - 1 : -1], dim=-1)
    targets = torch.tensor(list(completion_token_ids))
    return logprobs.gather(1, targets[:, None])[:, 0].tolist()
