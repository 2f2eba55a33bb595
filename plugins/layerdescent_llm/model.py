"""A causal LM read through the logit lens: chosen hidden states through its own final norm and LM head."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn
from torch.nn import functional as F

from layerdescent_language import AdaptersOnlyState, final_norm_name

from .cross_entropy import linear_cross_entropy, native_bf16


def read_layers(num_hidden: int, which: str, every: int, last: int) -> list[int]:
    """The hidden states read, 0 = embeddings < ... < ``num_hidden``: all, every ``every``-th, or the last ``last``."""
    if which == "every-k":
        return sorted(set(range(0, num_hidden, every)) | {num_hidden})
    if which == "last-m":
        return [0, *range(num_hidden - last + 1, num_hidden + 1)]
    return list(range(num_hidden + 1))


class LogitLens(AdaptersOnlyState, nn.Module):
    """A causal LM whose chosen hidden states are read through its final norm and LM head."""

    def __init__(self, lm: nn.Module, read: list[int], adapters_only: bool = False) -> None:
        super().__init__()
        self.lm = lm
        self.read = read
        self.adapters_only = adapters_only
        self._norm_name = final_norm_name(lm.base_model, "the logit lens")

    @property
    def final_norm(self) -> nn.Module:
        """The norm the model applies before its LM head (looked up, not registered twice)."""
        return getattr(self.lm.base_model, self._norm_name)

    @property
    def num_hidden(self) -> int:
        return self.lm.config.num_hidden_layers

    @property
    def head(self) -> nn.Module:
        """The LM head (vocabulary logits of a normed hidden state)."""
        return self.lm.get_output_embeddings()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The input token embeddings."""
        return self.lm.get_input_embeddings()(input_ids)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """The read hidden states, B x T x H each; only the last is normed."""
        out = self.lm.base_model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
        # last_hidden_state is what the model's own head sees, already through the final norm; whether
        # hidden_states[-1] is normed too depends on the architecture, so it is never read.
        return [out.last_hidden_state if k == self.num_hidden else out.hidden_states[k] for k in self.read]

    def losses(
        self, states: list[torch.Tensor], targets: torch.Tensor, tokens: int = 0, chunk: int = 0, inner_bf16: bool = False
    ) -> torch.Tensor:
        """Per-sample next-token cross-entropy of every read state, B x len(read); ``targets`` B x T, -100 where none.

        The head sees only positions with a target. The last state is read at every one (exact);
        the others at ``tokens`` random target positions per sequence (all of them if 0 or if
        fewer), so each entry is an unbiased estimate of the sample's mean loss. The same
        positions serve every layer, so layer-to-layer differences carry less sampling noise.
        A linear head's logits are formed ``chunk`` vocabulary entries at a time, so they never
        exist whole (0: at once, through the head module, as a plain readout does).
        ``inner_bf16`` runs the head's products for all but the last state in bfloat16 when
        gradients are on and the device multiplies bfloat16 natively: evaluation stays exact.
        """
        batch, length = targets.shape
        valid = targets != -100
        last = valid.flatten().nonzero().squeeze(1)
        if tokens and tokens < valid.sum(1).max():
            keys = torch.rand(targets.shape, device=targets.device).masked_fill(~valid, 2.0)
            order = keys.argsort(dim=1)[:, :tokens]  # a uniform random subset of each row's target positions
            picked = (order + length * torch.arange(batch, device=targets.device)[:, None])[valid.gather(1, order)]
        else:
            picked = last
        inner = len(states) - 1
        wanted = targets.flatten()
        # The last state is normed already and is the model's own loss: it keeps the model's precision.
        ce = self._cross_entropy(states[-1].flatten(0, 1)[last], wanted[last], chunk)
        if inner:  # one norm call and one head pass for all intermediate rows
            rows = self.final_norm(torch.cat([state.flatten(0, 1)[picked] for state in states[:-1]]))
            fast = inner_bf16 and torch.is_grad_enabled() and native_bf16(rows.device)
            with torch.autocast(rows.device.type, dtype=torch.bfloat16) if fast else nullcontext():
                ce = torch.cat([self._cross_entropy(rows, wanted[picked].repeat(inner), chunk), ce])
        where = torch.cat([picked.repeat(inner), last])
        columns = torch.cat([torch.arange(inner, device=where.device).repeat_interleave(len(picked)), torch.full_like(last, inner)])
        index = (where // length, columns)
        sums = torch.zeros(batch, len(states), device=ce.device).index_put_(index, ce, accumulate=True)
        counts = torch.zeros(batch, len(states), device=ce.device).index_put_(index, torch.ones_like(ce), accumulate=True)
        return sums / counts.clamp_min(1)

    def _cross_entropy(self, hidden: torch.Tensor, target: torch.Tensor, chunk: int) -> torch.Tensor:
        head = self.head
        if chunk and type(head) is nn.Linear:  # a wrapped head (LoRA on lm_head, say) runs as itself
            return linear_cross_entropy(hidden, head.weight, target, head.bias, chunk)
        return F.cross_entropy(head(hidden).float(), target, reduction="none")

    def label_logits(self, states: list[torch.Tensor], positions: torch.Tensor, label_ids: torch.Tensor) -> torch.Tensor:
        """Logits of the label tokens only, at one position per sample of every read state: B x len(states) x labels.

        The intermediate states go through the final norm first; the last is normed already.
        Two rows of the head make this the label-restricted lens (the verbalizer view).
        """
        rows = torch.arange(len(positions), device=positions.device)
        hidden = torch.stack([state[rows, positions] for state in states], dim=1)  # B x S x H
        if len(states) > 1:
            hidden = torch.cat([self.final_norm(hidden[:, :-1]), hidden[:, -1:]], dim=1)
        bias = self.head.bias[label_ids] if getattr(self.head, "bias", None) is not None else None
        return F.linear(hidden, self.head.weight[label_ids], bias).float()
