"""Cross-entropy of a linear layer's logits, a vocabulary chunk at a time, so the logits never exist whole."""

from __future__ import annotations

from typing import Any

import torch

# Liger's and Cut Cross-Entropy's fused kernels do this in Triton, on GPUs only; this runs on any device.


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None = None, chunk: int = 1024
) -> torch.Tensor:
    """Per-row ``cross_entropy(hidden @ weight.T + bias, target)``, computed ``chunk`` vocabulary entries at a time.

    Exact, with memory that grows with ``chunk``, not the vocabulary: a running log-sum-exp over
    the chunks gives the loss. When only ``hidden`` needs a gradient (a frozen head), the same pass
    also forms it, the softmax-weighted mean of the head's rows, so the backward pass is a product
    with the upstream gradient; a trainable head recomputes each chunk's logits in the backward
    pass. Under autocast the products run in its dtype and the softmax in float32.
    """
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    trainable = any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    with torch.autocast(device, enabled=False):
        if torch.is_grad_enabled() and trainable:
            return _LinearCrossEntropy.apply(hidden.to(dtype), weight, bias, target, chunk)
        return _chunked(hidden.to(dtype), weight, bias, target, chunk, gradient=False)[0]


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices in hardware, so they beat float32 ones."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":  # torch's own probes; without AVX512-BF16 or AMX, bfloat16 products are emulated and slow
        return any(getattr(torch.cpu, probe, lambda: False)() for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return False


def _logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, start: int, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the head's rows (in the products' dtype) and its float32 logits."""
    rows = weight[start : start + chunk].to(hidden.dtype)
    logits = (hidden @ rows.T).float()
    if bias is not None:
        logits += bias[start : start + chunk].float()
    return rows, logits


def _chunked(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor, chunk: int, gradient: bool
) -> tuple[torch.Tensor, ...]:
    """The loss, the log-sum-exp, and with ``gradient`` the loss's gradient in ``hidden``, over the chunks."""
    top = torch.full((len(hidden),), float("-inf"), device=hidden.device)
    total = torch.zeros_like(top)
    mean = torch.zeros(hidden.shape, device=hidden.device) if gradient else None
    for start in range(0, len(weight), chunk):
        rows, logits = _logits(hidden, weight, bias, start, chunk)
        new_top = torch.maximum(top, logits.amax(1))
        rescale = (top - new_top).exp()
        probs = (logits - new_top[:, None]).exp_()
        total = total * rescale + probs.sum(1)
        if gradient:  # the softmax-weighted mean of the head's rows, rescaled as the running max moves
            mean.mul_(rescale[:, None]).add_(probs.to(hidden.dtype) @ rows)
        top = new_top
    lse = top + total.log()
    picked = weight[target].to(hidden.dtype)
    target_logit = (hidden * picked).float().sum(1) + (bias[target].float() if bias is not None else 0.0)
    return lse - target_logit, lse, (mean / total[:, None] - picked.float()) if gradient else None


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        # The gradient is formed in this pass only when nothing else needs the chunks again.
        ctx.direction = ctx.needs_input_grad[0] and not any(ctx.needs_input_grad[1:3])
        ctx.chunk, ctx.dtype = chunk, hidden.dtype
        ce, lse, direction = _chunked(hidden, weight, bias, target, chunk, gradient=ctx.direction)
        ctx.save_for_backward(*((direction,) if ctx.direction else (hidden, weight, bias, target, lse)))
        return ce

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad = grad.float()
        if ctx.direction:
            (direction,) = ctx.saved_tensors
            return (grad[:, None] * direction).to(ctx.dtype), None, None, None, None
        hidden, weight, bias, target, lse = ctx.saved_tensors
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros(hidden.shape, device=hidden.device) if needs_hidden else None
        grad_weight = torch.zeros(weight.shape, device=weight.device) if needs_weight else None
        grad_bias = torch.zeros(bias.shape, device=bias.device) if needs_bias else None
        for start in range(0, len(weight), ctx.chunk):
            rows, logits = _logits(hidden, weight, bias, start, ctx.chunk)
            scaled = (logits - lse[:, None]).exp_() * grad[:, None]  # d loss / d logits, less the target's one-hot
            if needs_hidden:
                grad_hidden += scaled.to(hidden.dtype) @ rows
            if needs_weight:
                grad_weight[start : start + ctx.chunk] = scaled.T.to(hidden.dtype) @ hidden
            if needs_bias:
                grad_bias[start : start + ctx.chunk] = scaled.sum(0)
        if needs_hidden:
            grad_hidden -= grad[:, None] * weight[target].float()
            grad_hidden = grad_hidden.to(hidden.dtype)
        if needs_weight:
            grad_weight = grad_weight.index_add_(0, target, -grad[:, None] * hidden.float()).to(weight.dtype)
        if needs_bias:
            grad_bias = grad_bias.index_add_(0, target, -grad).to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None
