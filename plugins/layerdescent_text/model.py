"""A pretrained encoder (or causal LM) read out at every layer: pooled hidden states through a classifier head."""

from __future__ import annotations

import torch
from torch import nn

from layerdescent import require
from layerdescent.optional import quiet_transformers
from layerdescent_language import AdaptersOnlyState, final_norm_name


class LayerwiseClassifier(AdaptersOnlyState, nn.Module):
    """Class logits from every hidden state of ``encoder``: B x (L + 1) x classes.

    ``causal`` marks a decoder backbone (a causal LM's base model): its intermediate hidden
    states are raw residual streams, so they pass through the model's own final norm before the
    head, as the last one does inside the model (the logit-lens view); ``last`` pooling reads
    the last real token, the only one that has seen the whole sentence.
    """

    def __init__(
        self,
        encoder: nn.Module,
        num_labels: int,
        head: str = "shared",
        pooling: str = "mean",
        causal: bool = False,
        adapters_only: bool = False,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        self.adapters_only = adapters_only
        self._norm_name = final_norm_name(encoder, "reading a causal LM's intermediate layers") if causal else None
        hidden, layers = encoder.config.hidden_size, encoder.config.num_hidden_layers
        # One head for every layer is the unrolling view: each layer refines one shared estimate.
        self.heads = nn.ModuleList(nn.Linear(hidden, num_labels) for _ in range(1 if head == "shared" else layers + 1))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The input (word) embeddings, before position embeddings and normalisation."""
        return self.encoder.get_input_embeddings()(input_ids)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self._norm_name is None:
            out = self.encoder(inputs_embeds=inputs_embeds, attention_mask=attention_mask, output_hidden_states=True)
            states = torch.stack(out.hidden_states, dim=1)  # B x (L + 1) x T x H; layer 0 is the embedding output
        else:
            out = self.encoder(inputs_embeds=inputs_embeds, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
            norm = getattr(self.encoder, self._norm_name)
            # last_hidden_state is normed already; whether hidden_states[-1] is depends on the architecture.
            states = torch.stack([*map(norm, out.hidden_states[:-1]), out.last_hidden_state], dim=1)
        if self.pooling == "mean":
            mask = attention_mask[:, None, :, None].to(states.dtype)
            pooled = (states * mask).sum(2) / mask.sum(2).clamp_min(1)
        elif self.pooling == "last":  # right padding: the last real token is at length - 1
            last = (attention_mask.sum(1) - 1).clamp_min(0)
            pooled = states[torch.arange(len(last), device=states.device), :, last]
        else:
            pooled = states[:, :, 0]
        if len(self.heads) == 1:
            return self.heads[0](pooled)
        return torch.stack([head(pooled[:, k]) for k, head in enumerate(self.heads)], dim=1)


def _transformers():
    """transformers, its loading progress bars silenced."""
    return quiet_transformers(require("transformers", extra="text", purpose="task text-classification"))


def load_encoder(path: str) -> nn.Module:
    """The pretrained encoder (a causal LM's base model) of a local Hugging Face directory, in float32, with remote code off."""
    transformers = _transformers()
    # float32 whatever the checkpoint holds: the optimizer and the perturbations work in it.
    return transformers.AutoModel.from_pretrained(path, trust_remote_code=False, local_files_only=True).float()


def is_causal(config: object) -> bool:
    """Whether a Hugging Face config describes a causal LM (a decoder read left to right)."""
    return any(name.endswith("ForCausalLM") for name in (getattr(config, "architectures", None) or []))


def tiny_bert(vocab_size: int, layers: int = 2) -> nn.Module:
    """A small random BERT (hidden 32) for the offline fallback, initialised from the global RNG."""
    transformers = _transformers()
    config = transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return transformers.BertModel(config, add_pooling_layer=False)
