"""Fine-tuning pieces for pretrained Hugging Face models: LoRA adapters, adapter-only state, the final norm."""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

import layerdescent
from layerdescent import require

# Names of the final norm in the base models of common Hugging Face causal LMs (Llama, GPT-2, OPT, Falcon).
FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "norm_f")


def add_lora(lm: nn.Module, rank: int, alpha: int, targets: list[str]) -> nn.Module:
    """``lm`` with LoRA adapters on the ``targets`` projections and every other parameter frozen."""
    peft = require("peft", extra="llm", purpose="finetune = 'lora'")
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0)
    try:
        with warnings.catch_warnings():  # peft calls a transformers method that v5 deprecates; nothing for a user to act on
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            # The wrapper is dropped: the adapters live in the base model, which keeps its own forward.
            return peft.get_peft_model(lm, config).get_base_model()
    except ValueError as exc:
        raise layerdescent.ConfigError(
            f"task.lora_targets {','.join(targets)!r} do not fit this model ({exc}); name its attention projections, or set finetune = 'full'"
        ) from None


def final_norm_name(base: nn.Module, why: str) -> str:
    """The attribute name of ``base``'s final norm (the one before its LM head), or ConfigError saying ``why`` it is needed."""
    name = next((name for name in FINAL_NORMS if isinstance(getattr(base, name, None), nn.Module)), None)
    if name is None:
        raise layerdescent.ConfigError(
            f"the model's {type(base).__name__} has no final norm named {', '.join(FINAL_NORMS)}; {why} needs one"
        )
    return name


class AdaptersOnlyState:
    """A module mixin whose state dict holds only what training changes when ``adapters_only`` (LoRA) is set.

    The frozen pretrained base is rebuilt by the task on every load, so checkpoints stay small.
    """

    adapters_only: bool = False

    def _frozen(self, prefix: str) -> set[str]:
        # Every alias of a frozen tensor (a tied LM head too), not only the name named_parameters reports first.
        return (
            {prefix + name for name, p in self.named_parameters(remove_duplicate=False) if not p.requires_grad}
            if self.adapters_only
            else set()
        )

    def state_dict(self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> dict[str, Any]:
        """What training changes; with LoRA only the adapters, since build_model rebuilds the frozen base."""
        state = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        for key in self._frozen(prefix) & set(state):
            del state[key]
        return state

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load what ``state_dict`` saved; with LoRA the frozen base keeps its pretrained weights."""
        if not self.adapters_only:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        missing = [key for key in result.missing_keys if key not in self._frozen("")]
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(f"LoRA state does not fit this model: missing {missing}, unexpected {result.unexpected_keys}")
        return result
