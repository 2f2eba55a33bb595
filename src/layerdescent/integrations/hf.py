"""Descent constraints in a Hugging Face ``transformers.Trainer``: a per-layer readout of the hidden states, one update.

    trainer = DescentTrainer(
        model=model, args=TrainingArguments(...), train_dataset=dataset,
        constraints=[Descent(alpha=0.05)],
        readout=lambda hidden, inputs: cross_entropy(model.classifier(hidden[:, 0]), inputs["labels"], reduction="none"),
        dual_lr=0.5,
    )
    trainer.train()   # train/lambda/descent/l1_le_l0, train/violation/descent/l1_le_l0, ... in trainer.state.log_history

Constraints held per sample or per level read each row's index and level from two dataset columns,
``rows_column`` (default ``"row_index"``: 0..len(train_dataset)-1) and ``levels_column`` (default
``"level"``: an index into ``band``, the perturbation levels the user's own collator applied);
the model never sees them.

The model runs with ``output_hidden_states=True``; the readout turns each of its hidden states
0..L (0: the embeddings) into per-sample losses, and the Trainer backpropagates the primal
Lagrangian of the B x (L+1) losses. The Trainer takes the model's optimizer step as usual, and the
multipliers step once per optimizer step after it (gradient accumulation included), through the
same :class:`~layerdescent.core.update.LayerwiseUpdate` the project's own trainer uses, called the same
way: ``forward`` per micro-batch (the Trainer runs the backward pass), ``dual_step`` per step,
``record`` per log line.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from layerdescent.core.constraints import ConstraintSpec
from layerdescent.core.divergence import diverged
from layerdescent.core.update import LayerwiseUpdate, checked_solver
from layerdescent.errors import ConfigError, PluginError
from layerdescent.optional import require
from layerdescent.registry import Registry, get_registry

transformers = require("transformers", extra="hf", purpose="layerdescent.DescentTrainer")
require("accelerate", extra="hf", purpose="layerdescent.DescentTrainer")  # the Trainer's own dependency, named here rather than deep in it

STATE_FILE = "layerdescent_update.pt"  # beside the Trainer's optimizer.pt in each checkpoint-N folder

Readout = Callable[[torch.Tensor, dict], torch.Tensor]


class DescentTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` whose every layer must lower the loss: a readout per hidden state, solved primal-dual."""

    def __init__(
        self,
        *args: Any,
        constraints: Sequence[ConstraintSpec],
        readout: Readout,
        solver: str = "primal-dual",
        registry: Registry | None = None,
        band: Sequence[float] = (),
        rows_column: str = "row_index",
        levels_column: str = "level",
        **kwargs: Any,
    ) -> None:
        trainer_keys = set(inspect.signature(transformers.Trainer.__init__).parameters)
        options = {k: kwargs.pop(k) for k in list(kwargs) if k not in trainer_keys}
        if kwargs.get("compute_loss_func") is not None:
            raise ConfigError("DescentTrainer's loss is the readout's at every layer: drop compute_loss_func and give readout=")
        self.registry = registry or get_registry()
        self.constraints = tuple(constraints)
        self.readout = readout
        self.solver_name = solver
        self.solver_options = options
        self.band = tuple(band)
        self.columns = {
            "rows": rows_column if any(spec.per_sample for spec in self.constraints) else None,
            "levels": levels_column if any(spec.levels is not None for spec in self.constraints) else None,
        }
        self.update: LayerwiseUpdate | None = None  # built around the Trainer's optimizer, once it exists
        super().__init__(*args, **kwargs)
        self._check_columns()
        self.num_layers = _depth(self.model)
        self._check(options)
        # The loss is a per-batch mean: the Trainer divides it by the accumulation steps, never the model's loss kwargs.
        self.model_accepts_loss_kwargs = False
        self.add_callback(_DualStep(self))

    def _check(self, options: dict[str, Any]) -> None:
        """Refuse what cannot train before anything runs: bad constraints, readout, solver or options."""
        if self.args.label_smoothing_factor:
            raise ConfigError(
                f"TrainingArguments.label_smoothing_factor = {self.args.label_smoothing_factor:g} smooths the model's own loss, which DescentTrainer replaces by the readout's: set it to 0 and smooth in the readout (cross_entropy(..., label_smoothing={self.args.label_smoothing_factor:g}))"
            )
        if self.args.world_size > 1 and _sharded_by_hand(self.model) and not (self.args.fsdp or self.args.deepspeed):
            # the Trainer would wrap it in DDP, which fails deep in a broadcast of its sharded weights
            raise ConfigError(
                "the model was sharded by hand (torch's fully_shard), which the Trainer cannot train: pass the unsharded model with TrainingArguments(fsdp='full_shard') on GPUs, or train the sharded model through layerdescent.LayerwiseUpdate in your own loop (docs/scaling.md)"
            )
        if not callable(self.readout):
            raise ConfigError(
                f"readout must be a function readout(hidden_state, inputs) -> per-sample losses (B,), got {type(self.readout).__name__}"
            )
        solver_cls = self.registry.solver(self.solver_name)
        known = {name for cls in self.registry.solvers.values() for name in cls.Options.__dataclass_fields__}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(
                f"DescentTrainer got unexpected keyword arguments {', '.join(unknown)}: neither transformers.Trainer arguments nor solver options (solver {self.solver_name!r} accepts: {', '.join(sorted(solver_cls.Options.__dataclass_fields__)) or 'none'})"
            )
        _, settings = checked_solver(self.constraints, self.num_layers, self.solver_name, self.registry, options)
        solver_cls.scheme_of(settings).check_outside_primal(
            "DescentTrainer steps the multipliers after the Trainer's own optimizer step",
            "for the other schemes use layerdescent.LayerwiseUpdate in your own loop",
        )

    def _check_columns(self) -> None:
        """Refuse a per-sample or per-level constraint whose dataset lacks the column that says where each row came from."""
        for what, column in self.columns.items():
            if column is None:
                continue
            names = getattr(self.train_dataset, "column_names", None)
            if names is not None and column not in names:
                option = "rows_column" if what == "rows" else "levels_column"
                example = (
                    "dataset.add_column('row_index', list(range(len(dataset))))"
                    if what == "rows"
                    else "a column of band indices set by your perturbing collator"
                )
                raise ConfigError(
                    f"a constraint held per {'sample' if what == 'rows' else 'level'} needs each training row's {'index' if what == 'rows' else 'level'}: train_dataset has no column {column!r} ({option}=...; e.g. {example})"
                )
        if any(self.columns.values()) and self.args.remove_unused_columns:
            # the Trainer drops columns the model's forward does not take; these are the update's, not the model's
            self._set_signature_columns_if_needed()
            self._signature_columns = [*self._signature_columns, *(c for c in self.columns.values() if c)]

    def create_optimizer(self, *args: Any, **kwargs: Any) -> torch.optim.Optimizer:
        """The Trainer's optimizer, and the one LayerwiseUpdate around it."""
        optimizer = super().create_optimizer(*args, **kwargs)
        if self.update is None:
            rows = len(self.train_dataset) if self.columns["rows"] else None
            self.update = LayerwiseUpdate(
                self.constraints,
                self.num_layers,
                optimizer,
                self.solver_name,
                registry=self.registry,
                band=self.band,
                rows=rows,
                **self.solver_options,
            ).to(self.args.device)
        return optimizer

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
        """In training the primal Lagrangian of every layer's readout; in evaluation the last layer's mean readout loss."""
        where = {what: inputs.get(column) for what, column in self.columns.items() if column}
        inputs = {k: v for k, v in inputs.items() if k not in self.columns.values()}
        outputs = _forward(model, inputs)
        losses = self.layer_losses(outputs, inputs)
        if model.training and self.update is None:
            # Training on without the update would drop every constraint and train the last layer alone, silently.
            raise ConfigError(
                "DescentTrainer puts the constraints in the optimizer it builds in create_optimizer, which this run skipped "
                '(a DeepSpeed config with an "optimizer" section builds DeepSpeed\'s own): remove that section so the Trainer '
                "builds the optimizer, or build yours inside create_optimizer and call super().create_optimizer()"
            )
        if model.training:
            # the Trainer divides the loss by its accumulation steps and backpropagates it; the update counts the means with that share
            weight = 1.0 / getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
            loss = self.update.forward(
                losses.float(), weight, **where
            )  # the multipliers and means are float32, whatever the model's precision
        else:
            loss = losses[:, -1].mean()
        if not return_outputs:
            return loss
        # Evaluation gathers every output but the loss: the hidden states would be gathered too.
        kept = {k: v for k, v in outputs.items() if k != "hidden_states"}
        return loss, type(outputs)(**kept) if hasattr(outputs, "to_tuple") else kept

    def layer_losses(self, outputs: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """B x (L+1) per-sample losses: the readout of each hidden state, column 0 the embeddings'."""
        hidden = outputs.get("hidden_states") if isinstance(outputs, dict) else getattr(outputs, "hidden_states", None)
        if hidden is None:
            raise PluginError(
                f"{type(self.model).__name__} returned no hidden_states with output_hidden_states=True: DescentTrainer needs a model that returns one hidden state per layer (a transformers model with config.output_hidden_states support)"
            )
        if len(hidden) != self.num_layers + 1:
            raise PluginError(
                f"{type(self.model).__name__} returned {len(hidden)} hidden states; its config.num_hidden_layers = {self.num_layers} needs {self.num_layers + 1} (the embeddings and each layer)"
            )
        columns = []
        for k, state in enumerate(hidden):
            loss = self.readout(state, inputs)
            batch = state.shape[0]
            if not isinstance(loss, torch.Tensor) or loss.shape != (batch,) or not loss.is_floating_point():
                got = f"shape {tuple(loss.shape)} of {loss.dtype}" if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise PluginError(
                    f"readout returned {got} for hidden state {k}; it must return one floating-point loss per sample, shape ({batch},): use reduction='none'"
                )
            columns.append(loss)
        return torch.stack(columns, dim=1)

    def _end_step(self) -> None:
        """After each optimizer step: the multipliers' step from its layer means, averaged over ranks."""
        if self.accelerator.optimizer_step_was_skipped:
            self.update.discard()  # fp16's scaler found inf gradients and left the model as it was: lambda waits too
            return
        seen = self.update.dual_step()  # a step whose means are not finite moves no multiplier (seen.skipped)
        if seen.stop:
            raise diverged(f"step {self.state.global_step}: {seen.stop}")

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """The Trainer's log, with the multipliers and violations on every training line."""
        if "loss" in logs and self.update is not None:  # a training line; evaluation's keys are eval_*
            # means over the steps since the last line; the Trainer's loss is the Lagrangian, named as every front names it
            logs = {**logs, **self.update.scalars(), "train/lagrangian": logs["loss"]}
        super().log(logs, *args, **kwargs)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The Trainer's optimizer and scheduler, and beside them the update's multipliers and solver state."""
        super()._save_optimizer_and_scheduler(output_dir)
        if self.update is not None and self.args.should_save:
            torch.save(self.update.state_dict(), os.path.join(output_dir, STATE_FILE))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Restore what ``_save_optimizer_and_scheduler`` saved."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or self.update is None:
            return
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.isfile(path):
            raise ConfigError(
                f"{checkpoint} holds no {STATE_FILE}: it was not saved by a DescentTrainer, so its multipliers are unknown: resume from a checkpoint-N this DescentTrainer wrote, or train without resume_from_checkpoint"
            )
        self.update.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))


class _DualStep(transformers.TrainerCallback):
    """Steps the multipliers once per optimizer step, after the Trainer's own step."""

    def __init__(self, trainer: DescentTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After each optimizer step, the multipliers' step."""
        if self.trainer.update is not None:
            self.trainer._end_step()


def _sharded_by_hand(model: Any) -> bool:
    """Whether ``model`` or one of its modules was wrapped by torch's ``fully_shard`` (FSDP2)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # never imported here: a model sharded with it has imported it
    cls = getattr(fsdp, "FSDPModule", None)
    return cls is not None and any(isinstance(module, cls) for module in model.modules())


def _depth(model: Any) -> int:
    """L, the model's layer count, from its config."""
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if not isinstance(layers, int) or layers < 1:
        raise PluginError(
            f"{type(model).__name__} has no config.num_hidden_layers: DescentTrainer needs a transformers model, whose config says how many hidden states it returns"
        )
    return layers


def _forward(model: Any, inputs: dict[str, Any]) -> Any:
    """The model's outputs with every hidden state."""
    try:
        return model(**inputs, output_hidden_states=True)
    except TypeError as exc:
        if "output_hidden_states" not in str(exc):
            raise
        raise PluginError(
            f"{type(model).__name__}.forward does not take output_hidden_states: DescentTrainer needs a model that returns one hidden state per layer"
        ) from None
