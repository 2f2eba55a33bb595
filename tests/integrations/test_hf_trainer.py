"""DescentTrainer trains a Hugging Face model under descent constraints, logs its multipliers, and refuses what cannot train."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

import layerdescent as ld

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "own-loop.md"  # where the Trainer example lives
needs_hf = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
    reason="the Trainer integration needs transformers and accelerate (pip install 'layerdescent[hf]')",
)


def _tiny_bert(layers: int = 2):
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=32,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        num_labels=2,
    )
    return transformers.BertForSequenceClassification(config)


def _rows(n: int = 32) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 32, (n, 6), generator=g)
    return [{"input_ids": x, "attention_mask": torch.ones(6, dtype=torch.long), "labels": int(x[1] >= 16)} for x in ids]


def _cls_readout(model):
    def readout(hidden, inputs):
        return torch.nn.functional.cross_entropy(model.classifier(hidden[:, 0]), inputs["labels"], reduction="none")

    return readout


def _trainer(tmp_path, model=None, readout=None, steps: int = 4, accumulate: int = 1, constraints=None, **kwargs):
    import transformers

    model = model or _tiny_bert()
    trainer_args = {k: kwargs.pop(k) for k in ("save_steps", "save_strategy", "label_smoothing_factor") if k in kwargs}
    if kwargs.pop("recompute", False):  # transformers 5 renamed gradient_checkpointing
        fields = transformers.TrainingArguments.__dataclass_fields__
        trainer_args["activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"] = True
    args = transformers.TrainingArguments(
        str(tmp_path / "out"),
        max_steps=steps,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=accumulate,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy=trainer_args.pop("save_strategy", "no"),
        **trainer_args,
    )
    return ld.DescentTrainer(
        model=model,
        args=args,
        train_dataset=_rows(),
        constraints=constraints or [ld.Descent(alpha=0.05)],
        readout=readout or _cls_readout(model),
        **kwargs,
    )


def _lines(trainer) -> list[dict]:
    return [line for line in trainer.state.log_history if "loss" in line]


@needs_hf
def test_docs_hf_example_trains_under_descent_constraints_exactly_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the example writes its checkpoints under ./hf-run
    code = re.search(r"<!-- hf-example -->\n```python\n(.*?)```", GUIDE.read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/own-loop.md:hf", "exec"), namespace)
    trainer = namespace["trainer"]
    last = _lines(trainer)[-1]
    assert trainer.state.global_step == 20 and {
        "train/lambda/descent/l1_le_l0",
        "train/lambda/descent/l2_le_l1",
        "train/violation/descent/l2_le_l1",
        "train/loss/l2",
    } <= set(last)
    assert (tmp_path / "hf-run" / "checkpoint-20" / "layerdescent_update.pt").is_file()


@needs_hf
def test_a_violated_constraint_raises_its_multipliers_in_the_trainer_logs(tmp_path):
    trainer = _trainer(tmp_path, constraints=[ld.Descent(alpha=0.5)], dual_lr=1.0)
    trainer.train()
    lines = _lines(trainer)
    assert len(lines) == 4
    # halving the loss at every layer is out of reach: every entry stays violated and its lambda climbs
    assert all(line["train/violation/descent/l1_le_l0"] > 0 and line["train/violation/descent/l2_le_l1"] > 0 for line in lines)
    lambdas = [line["train/lambda/descent/l2_le_l1"] for line in lines]
    assert lambdas[0] > 0 and lambdas == sorted(lambdas) and lambdas[-1] > lambdas[0]
    assert trainer.update.multipliers()["descent"].tolist() == [
        lines[-1]["train/lambda/descent/l1_le_l0"],
        lines[-1]["train/lambda/descent/l2_le_l1"],
    ]


@needs_hf
def test_a_multiplier_past_max_multiplier_stops_the_trainer_naming_the_step_and_entry(tmp_path):
    trainer = _trainer(tmp_path, constraints=[ld.Descent(alpha=0.5)], dual_lr=1000.0, max_multiplier=1.0)
    with pytest.raises(
        ld.DivergenceError, match=r"step 1: multiplier of constraint 'descent' exploded, l\d<=l\d = .* > solver.max_multiplier = 1"
    ):
        trainer.train()


@needs_hf
def test_lambda_steps_once_per_optimizer_step_from_the_mean_of_its_micro_batches(tmp_path, monkeypatch):
    from layerdescent.core.update import LayerwiseUpdate
    from layerdescent.integrations.hf import DescentTrainer

    micro, observed = [], []
    layer_losses, dual_step = DescentTrainer.layer_losses, LayerwiseUpdate.dual_step

    def spy_losses(self, outputs, inputs):
        losses = layer_losses(self, outputs, inputs)
        micro.append(losses.detach().mean(0))
        return losses

    monkeypatch.setattr(DescentTrainer, "layer_losses", spy_losses)
    # what the dual step reads: the step's observation, over its micro-batches
    monkeypatch.setattr(
        LayerwiseUpdate,
        "dual_step",
        lambda self: (observed.append((len(micro), self.scheme.observation().means.clone())), dual_step(self))[1],
    )
    trainer = _trainer(tmp_path, steps=3, accumulate=2, constraints=[ld.Descent(alpha=0.5)], dual_lr=1.0)
    trainer.train()
    assert len(micro) == 6 and [seen for seen, _ in observed] == [2, 4, 6]  # each dual step follows its own step's micro-batches, once
    for step, (_, means) in enumerate(observed):
        assert torch.allclose(means, (micro[2 * step] + micro[2 * step + 1]) / 2)
    primal = trainer.update.optimizer.primal_optimizers[0]
    assert {int(state["step"]) for state in primal.state.values()} == {3}  # the Trainer's optimizer stepped once a step, never twice


@needs_hf
def test_a_step_the_mixed_precision_scaler_skips_leaves_the_multipliers_where_they_were(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, constraints=[ld.Descent(alpha=0.5)], dual_lr=1.0)
    # fp16 needs a GPU; its scaler's verdict is what the Trainer reads, so every step here is a skipped one
    monkeypatch.setattr(type(trainer.accelerator), "optimizer_step_was_skipped", property(lambda self: True))
    trainer.train()
    assert all(line["train/lambda/descent/l2_le_l1"] == 0.0 for line in _lines(trainer))
    monkeypatch.undo()
    trainer = _trainer(tmp_path, constraints=[ld.Descent(alpha=0.5)], dual_lr=1.0)
    trainer.train()
    assert _lines(trainer)[-1]["train/lambda/descent/l2_le_l1"] > 0.0


@needs_hf
def test_label_smoothing_in_the_training_arguments_is_refused_pointing_at_the_readout(tmp_path):
    with pytest.raises(ld.ConfigError, match=r"label_smoothing_factor = 0.1 .*cross_entropy\(\.\.\., label_smoothing=0.1\)"):
        _trainer(tmp_path, label_smoothing_factor=0.1)


@needs_hf
def test_an_optimizer_built_outside_create_optimizer_is_refused_instead_of_dropping_the_constraints(tmp_path):
    import transformers

    trainer = _trainer(tmp_path)
    # DeepSpeed's own optimizer (a config with an "optimizer" section) is built without create_optimizer, like this.
    trainer.create_optimizer = lambda *args, **kwargs: transformers.Trainer.create_optimizer(trainer)
    with pytest.raises(ld.ConfigError, match=r'DeepSpeed config with an "optimizer" section'):
        trainer.train()


@needs_hf
def test_erm_trains_with_its_multipliers_logged_at_zero(tmp_path):
    trainer = _trainer(tmp_path, solver="erm", constraints=[ld.Descent(alpha=0.5)])
    trainer.train()
    lines = _lines(trainer)
    assert len(lines) == 4 and all(
        line["train/lambda/descent/l1_le_l0"] == 0 and line["train/lambda/descent/l2_le_l1"] == 0 for line in lines
    )
    assert all(line["train/violation/descent/l1_le_l0"] > 0 for line in lines)  # measured, never enforced


@needs_hf
def test_gradient_checkpointing_gives_the_multipliers_and_layer_losses_of_a_plain_run(tmp_path):
    options = {"steps": 4, "constraints": [ld.Descent(alpha=0.5)], "dual_lr": 1.0}
    calls = {}
    trainers = {}
    for name, recompute in (("plain", False), ("recomputed", True)):
        trainers[name] = _trainer(tmp_path / name, recompute=recompute, **options)
        calls[name] = 0
        trainers[name].model.bert.encoder.layer[0].attention.register_forward_hook(
            lambda *_, name=name: calls.__setitem__(name, calls[name] + 1)
        )
        trainers[name].train()
    plain, recomputed = trainers["plain"], trainers["recomputed"]
    assert (calls["plain"], calls["recomputed"]) == (4, 8)  # each step's layer ran again in the backward pass (its inner modules do)
    keys = [k for k in _lines(plain)[0] if k.startswith(("train/lambda/", "train/loss/"))]
    assert len(keys) == 2 + 3 and _lines(plain)[-1]["train/lambda/descent/l2_le_l1"] > 0
    for a, b in zip(_lines(plain), _lines(recomputed)):
        assert [b[k] for k in keys] == pytest.approx([a[k] for k in keys], rel=1e-5, abs=1e-7)


@needs_hf
def test_a_bf16_readout_steps_the_multipliers_in_float32_close_to_a_float32_one(tmp_path):
    options = {"steps": 4, "constraints": [ld.Descent(alpha=0.5)], "dual_lr": 1.0}
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = _tiny_bert()
        readout = _cls_readout(model)
        runs[dtype] = _trainer(
            tmp_path / str(dtype),
            model=model,
            readout=lambda hidden, inputs, readout=readout, dtype=dtype: readout(hidden, inputs).to(dtype),
            **options,
        )
        runs[dtype].train()
    key = "train/lambda/descent/l2_le_l1"
    exact, rounded = [line[key] for line in _lines(runs[torch.float32])], [line[key] for line in _lines(runs[torch.bfloat16])]
    assert exact[-1] > 0
    # float32 means from bf16 losses: lambda moves by the losses' rounding (8 bits), not by a bf16 step's
    assert rounded == pytest.approx(exact, rel=1e-2) and rounded != exact
    assert all(value.dtype == torch.float32 for value in runs[torch.bfloat16].update.multipliers().values())


@needs_hf
def test_resuming_from_a_checkpoint_continues_with_the_saved_multipliers(tmp_path):
    options = {"steps": 4, "constraints": [ld.Descent(alpha=0.5)], "dual_lr": 1.0, "save_strategy": "steps", "save_steps": 2}
    whole = _trainer(tmp_path / "whole", **options)
    whole.train()
    resumed = _trainer(tmp_path / "whole", **options)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "out" / "checkpoint-2"))
    key = "train/lambda/descent/l2_le_l1"
    expected = {line["step"]: line[key] for line in _lines(whole) if line["step"] > 2}
    got = {line["step"]: line[key] for line in _lines(resumed) if line["step"] > 2}
    assert expected[3] > 2 * _lines(whole)[0][key]  # lambda had grown for two steps before the checkpoint
    assert got == pytest.approx(expected, rel=1e-4)


@needs_hf
def test_resuming_from_a_checkpoint_without_the_update_state_is_refused_naming_the_file(tmp_path):
    first = _trainer(tmp_path, steps=2, save_strategy="steps", save_steps=2)
    first.train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    (checkpoint / "layerdescent_update.pt").unlink()  # as a plain Trainer's checkpoint
    with pytest.raises(ld.ConfigError, match=r"checkpoint-2 holds no layerdescent_update.pt: it was not saved by a DescentTrainer"):
        _trainer(tmp_path, steps=3).train(resume_from_checkpoint=str(checkpoint))


@needs_hf
def test_evaluation_reports_the_last_layers_readout_loss(tmp_path):
    trainer = _trainer(tmp_path)
    metrics = trainer.evaluate(_rows(16))
    model, rows = trainer.model.eval(), _rows(16)
    with torch.no_grad():
        batch = {k: torch.stack([torch.as_tensor(r[k]) for r in rows]) for k in rows[0]}
        hidden = model(**batch, output_hidden_states=True).hidden_states[-1]
        expected = _cls_readout(model)(hidden, batch).mean().item()
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)


@needs_hf
def test_a_readout_of_the_wrong_shape_is_one_error_naming_the_shape_it_needs(tmp_path):
    model = _tiny_bert()

    def mean_loss(hidden, inputs):  # the batch mean, where each sample's loss is needed
        return torch.nn.functional.cross_entropy(model.classifier(hidden[:, 0]), inputs["labels"])

    trainer = _trainer(tmp_path, model=model, readout=mean_loss)
    with pytest.raises(
        ld.PluginError,
        match=r"^readout returned shape \(\) of torch.float32 for hidden state 0; it must return one floating-point loss per sample, shape \(8,\): use reduction='none'$",
    ):
        trainer.train()


@needs_hf
def test_a_model_without_hidden_states_is_refused_naming_what_it_needs(tmp_path):
    import transformers

    class NoHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = _tiny_bert()
            self.config = self.bert.config

        def forward(self, input_ids, attention_mask=None, labels=None, output_hidden_states=False):
            return transformers.modeling_outputs.SequenceClassifierOutput(logits=self.bert(input_ids, attention_mask).logits)

    model = NoHidden()
    trainer = _trainer(tmp_path, model=model, readout=_cls_readout(model.bert))
    with pytest.raises(
        ld.PluginError,
        match=r"^NoHidden returned no hidden_states with output_hidden_states=True: DescentTrainer needs a model that returns one hidden state per layer",
    ):
        trainer.train()
    with pytest.raises(ld.PluginError, match=r"^Linear has no config.num_hidden_layers"):
        _trainer(tmp_path, model=torch.nn.Linear(2, 2), readout=_cls_readout(model.bert))


@needs_hf
@pytest.mark.parametrize("scheme", ["alternating", "alternating-primal-dual", "extrapolation"])
def test_a_scheme_that_needs_its_own_loop_is_refused_before_training(tmp_path, scheme):
    with pytest.raises(
        ld.ConfigError,
        match=rf"needs scheme = 'simultaneous' \(got '{scheme}'\); for the other schemes use layerdescent.LayerwiseUpdate in your own loop",
    ):
        _trainer(tmp_path, scheme=scheme)


@needs_hf
def test_a_keyword_neither_the_trainer_nor_a_solver_takes_is_refused_naming_it(tmp_path):
    with pytest.raises(
        TypeError,
        match=r"unexpected keyword arguments dual_rate: neither transformers.Trainer arguments nor solver options \(solver 'primal-dual' accepts: .*dual_lr",
    ):
        _trainer(tmp_path, dual_rate=0.5)
    with pytest.raises(ld.ConfigError, match=r"solver.dual_lr must be >= 0, got -1"):
        _trainer(tmp_path, dual_lr=-1.0)


def _layer_losses(model, x):
    h, losses = x, [(x**2).mean(1)]
    for block in model:
        h = h + torch.tanh(block(h))
        losses.append((h**2).mean(1))
    return torch.stack(losses, dim=1)


def test_dual_step_after_a_primal_step_taken_elsewhere_matches_step():
    runs = []
    for own_step in (False, True):
        torch.manual_seed(0)
        model = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        update = ld.LayerwiseUpdate([ld.Descent(alpha=0.3)], num_layers=3, optimizer=optimizer, dual_lr=1.0)
        for _ in range(3):
            update.zero_grad()
            update.backward(_layer_losses(model, torch.randn(16, 4)))
            if own_step:
                optimizer.step()  # the caller's own primal step, as a Trainer takes it
                update.dual_step()
            else:
                update.step()
        runs.append((update.multipliers()["descent"], [p.detach().clone() for p in model.parameters()]))
    (lam, params), (lam_own, params_own) = runs
    assert lam.max() > 0 and torch.equal(lam, lam_own) and all(torch.equal(a, b) for a, b in zip(params, params_own))


def test_dual_step_is_refused_for_a_scheme_whose_dual_step_is_not_after_the_primal_one():
    model = torch.nn.Linear(4, 4)
    update = ld.LayerwiseUpdate([ld.Descent()], num_layers=2, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), scheme="alternating")
    with pytest.raises(
        ld.ConfigError,
        match=r"follows a primal step taken elsewhere, which needs scheme = 'simultaneous' \(got 'alternating'\); use step\(\) for it",
    ):
        update.dual_step()


@needs_hf
def test_a_per_sample_constraint_moves_only_the_rows_of_the_batches_the_trainer_took(tmp_path):
    rows = [{**row, "row_index": i} for i, row in enumerate(_rows())]
    trainer = _trainer(tmp_path, steps=1, constraints=[ld.Descent(alpha=0.5, per_sample=True)], dual_lr=1.0)
    trainer.train_dataset = rows
    trainer.train()
    table = trainer.update.multipliers()["descent"]
    assert table.shape == (32, 2)
    assert int((table > 0).any(dim=1).sum()) == 8  # one optimizer step of 8 rows; halving the loss is out of their reach
    assert "train/lambda/descent/l2_le_l1" in _lines(trainer)[-1]


@needs_hf
def test_a_per_sample_constraint_without_the_row_column_is_refused_naming_it(tmp_path):
    import datasets

    with pytest.raises(ld.ConfigError, match="has no column 'row_index'"):
        ld.DescentTrainer(
            model=_tiny_bert(),
            train_dataset=datasets.Dataset.from_list(
                [{k: v.tolist() if hasattr(v, "tolist") else v for k, v in r.items()} for r in _rows()]
            ),
            constraints=[ld.Descent(per_sample=True)],
            readout=lambda h, i: h.sum(dim=(1, 2)),
        )


@needs_hf
def test_a_per_level_constraint_moves_only_the_levels_its_rows_were_drawn_at(tmp_path):
    rows = [{**row, "level": 1} for row in _rows()]  # a collator of the user's own perturbed every row at band level 1
    trainer = _trainer(tmp_path, steps=1, constraints=[ld.Descent(alpha=0.5, levels="band")], dual_lr=1.0, band=[0.0, 0.5])
    trainer.train_dataset = rows
    trainer.train()
    assert trainer.update.labels["descent"] == ["l1<=l0@0", "l2<=l1@0", "l1<=l0@0.5", "l2<=l1@0.5"]
    moved = (trainer.update.multipliers()["descent"] > 0).tolist()
    assert moved == [False, False, True, True]
