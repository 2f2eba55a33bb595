"""Token-level pieces every language task shares: input perturbations and an offline word tokenizer."""

from __future__ import annotations

import torch

from layerdescent import require

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def gaussian_embeddings(embeds: torch.Tensor, real: torch.Tensor, gamma: float) -> torch.Tensor:
    """e + gamma * sigma * N(0, I) on real tokens, sigma the RMS of their clean embeddings."""
    weight = real.unsqueeze(-1).to(embeds.dtype)
    sigma = ((embeds.detach() ** 2 * weight).sum() / (weight.sum() * embeds.shape[-1]).clamp_min(1)).sqrt()
    return embeds + gamma * sigma * torch.randn_like(embeds) * weight


def substitute_tokens(ids: torch.Tensor, real: torch.Tensor, gamma: float, vocab_size: int) -> torch.Tensor:
    """Each real token replaced by a uniformly random vocabulary token with probability gamma."""
    hit = real & (torch.rand(ids.shape, device=ids.device) < gamma)
    return torch.where(hit, torch.randint_like(ids, vocab_size), ids)


def word_tokenizer(texts: list[str]) -> object:
    """An in-memory word-level tokenizer over the words of ``texts`` (the offline fallback)."""
    transformers = require("transformers", extra="text", purpose="the offline word tokenizer")
    tokenizers = require("tokenizers", extra="text", purpose="the offline word tokenizer")
    words = sorted({w for text in texts for w in text.lower().split()})
    vocab = {token: i for i, token in enumerate(SPECIAL + words)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = tokenizers.normalizers.Lowercase()
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    backend.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]"
    )
