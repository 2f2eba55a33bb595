"""A pretrained encoder read out at every layer: pooled hidden states through a classifier head."""

from __future__ import annotations

import torch
from torch import nn

from layerdescent import require
from layerdescent.optional import quiet_transformers

class LayerwiseClassifier(nn.Module):
    """Class logits from every hidden state of ``encoder``: B x (L + 1) x classes."""

    def __init__(self, encoder: nn.Module, num_labels: int, head: str = "shared", pooling: str = "mean") -> None:
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        hidden, layers = encoder.config.hidden_size, encoder.config.num_hidden_layers
        # One head for every layer is the unrolling view: each layer refines one shared estimate.
        self.heads = nn.ModuleList(nn.Linear(hidden, num_labels) for _ in range(1 if head == "shared" else layers + 1))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The input (word) embeddings, before position embeddings and normalisation."""
        return self.encoder.get_input_embeddings()(input_ids)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.encoder(inputs_embeds=inputs_embeds, attention_mask=attention_mask, output_hidden_states=True)
        states = torch.stack(out.hidden_states, dim=1)  # B x (L + 1) x T x H; layer 0 is the embedding output
        if self.pooling == "mean":
            mask = attention_mask[:, None, :, None].to(states.dtype)
            pooled = (states * mask).sum(2) / mask.sum(2).clamp_min(1)
        else:
            pooled = states[:, :, 0]
        if len(self.heads) == 1:
            return self.heads[0](pooled)
        return torch.stack([head(pooled[:, k]) for k, head in enumerate(self.heads)], dim=1)



def _transformers():
    """transformers, its loading progress bars silenced."""
    return quiet_transformers(require("transformers", extra="text", purpose="task text-classification"))

def load_tokenizer(path: str) -> tuple[object, object]:
    """The tokenizer and config of a local Hugging Face encoder directory, with remote code off."""
    transformers = _transformers()
    config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    return tokenizer, config


def load_encoder(path: str) -> nn.Module:
    """The pretrained encoder of a local Hugging Face directory, with remote code off."""
    transformers = _transformers()
    return transformers.AutoModel.from_pretrained(path, trust_remote_code=False, local_files_only=True)


def tiny_bert(vocab_size: int, layers: int = 2) -> nn.Module:
    """A small random BERT (hidden 32) for the offline fallback, initialised from the global RNG."""
    transformers = _transformers()
    config = transformers.BertConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64, max_position_embeddings=128
    )
    return transformers.BertModel(config, add_pooling_layer=False)
