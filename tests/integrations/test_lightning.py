"""DescentModule and DescentCallback: a LightningModule takes LayerwiseUpdate's steps, under DDP as on one process, resumes from Lightning's checkpoints exactly, and runs in bf16; the callback under automatic optimization (accumulation, clipping, schedulers)."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
from conftest import run_script
from helpers import REPO, docs_block

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="the Lightning integration needs lightning (pip install 'layerdescent[lightning]')",
)

# One model, written once: the tests build it in-process and the DDP runner in its own processes.
MODEL = textwrap.dedent(
    """
    import torch
    import lightning.pytorch as pl
    import layerdescent as ld


    def make_blocks():
        torch.manual_seed(0)
        return torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4)), torch.nn.Linear(8, 1)


    def per_layer(blocks, head, x, y):
        h, losses = x, []
        for block in [None, *blocks]:
            h = h if block is None else h + torch.tanh(block(h))
            losses.append(((head(h) - y) ** 2).squeeze(1))
        return torch.stack(losses, dim=1)


    def data():
        g = torch.Generator().manual_seed(1)
        x = torch.randn(256, 8, generator=g)
        return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).sin())


    class Model(ld.DescentModule):
        def __init__(self, **options):
            super().__init__([ld.Descent(alpha=0.05)], num_layers=4, **{"dual_lr": 0.5, **options})
            self.blocks, self.head = make_blocks()

        def layer_losses(self, batch, batch_idx):
            return per_layer(self.blocks, self.head, *batch)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)


    class Plain(pl.LightningModule):
        # a LightningModule that knows nothing of layerdescent: its step returns its loss and the per-layer losses

        def __init__(self, scheduler=None):
            super().__init__()
            self.blocks, self.head = make_blocks()
            self.scheduler = scheduler

        def training_step(self, batch, batch_idx):
            table = per_layer(self.blocks, self.head, *batch)
            return {"loss": table[:, -1].mean(), "layer_losses": table}

        def configure_optimizers(self):
            optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
            if self.scheduler is None:
                return optimizer
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler(optimizer), "interval": "step"}}
    """
)
namespace: dict = {}
exec(compile(MODEL, "model", "exec"), namespace)
Model, data, make_blocks, per_layer = namespace["Model"], namespace["data"], namespace["make_blocks"], namespace["per_layer"]
Plain = namespace["Plain"]

RUNNER = MODEL + textwrap.dedent(
    """
    import json, os, sys
    import lightning.pytorch as pl

    torch.set_num_threads(1)
    out, batch, front = sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "module"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = Model() if front == "module" else Plain()
    callback = [ld.DescentCallback([ld.Descent(alpha=0.05)], num_layers=4, dual_lr=0.5)] if front == "callback" else []
    # rank r reads rows r, r + 2, ... in order, so the ranks' shards of step k are one process's batch k
    rank = int(os.environ.get("RANK", "0"))
    sampler = torch.utils.data.distributed.DistributedSampler(data(), num_replicas=world, rank=rank, shuffle=False)
    loader = torch.utils.data.DataLoader(data(), batch_size=batch // world, sampler=sampler)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto", logger=False,
                         use_distributed_sampler=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callback)
    trainer.fit(model, loader)
    update = model.update if front == "module" else callback[0].update
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"lambda": update.multipliers()["descent"].tolist(), "steps": trainer.global_step,
                   "head": model.head.weight.flatten().tolist()}, f)
    """
)


def _trainer(**options):
    import lightning.pytorch as pl

    quiet = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
    return pl.Trainer(accelerator="cpu", devices=1, **{**quiet, **options})


def _loader(batch: int = 32):
    return torch.utils.data.DataLoader(data(), batch_size=batch)


def test_descent_module_takes_the_steps_of_layerwise_update():
    import layerdescent as ld

    model, trainer = Model(), _trainer(max_epochs=2)
    trainer.fit(model, _loader())
    blocks, head = make_blocks()
    optimizer = torch.optim.Adam([*blocks.parameters(), *head.parameters()], lr=1e-2)
    update = ld.LayerwiseUpdate([ld.Descent(alpha=0.05)], num_layers=4, optimizer=optimizer, dual_lr=0.5)
    for _ in range(2):
        for x, y in _loader():
            update.zero_grad()
            update.backward(per_layer(blocks, head, x, y))
            update.step()
    assert trainer.global_step == 16  # Lightning counted the steps the update took
    expected = update.multipliers()["descent"]
    assert bool((expected > 0).any())
    torch.testing.assert_close(model.update.multipliers()["descent"], expected)
    torch.testing.assert_close(model.head.weight, head.weight)
    assert {"train/lambda/descent/l1_le_l0", "train/violation/descent/l4_le_l3", "train/loss/l4", "train/lagrangian"} <= {
        key.removesuffix("_step").removesuffix("_epoch") for key in trainer.callback_metrics
    }


def test_ddp_on_two_cpu_processes_follows_one_process(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    one = run_script(RUNNER, tmp_path / "one", 1, "64")
    two = run_script(RUNNER, tmp_path / "two", 2, "64", torchrun=True)
    assert one[0]["steps"] == two[0]["steps"] == 8
    assert two[0]["lambda"] == two[1]["lambda"]  # the layer means were averaged over ranks before lambda stepped
    torch.testing.assert_close(torch.tensor(two[0]["lambda"]), torch.tensor(one[0]["lambda"]))
    torch.testing.assert_close(torch.tensor(two[0]["head"]), torch.tensor(one[0]["head"]))


def test_a_lightning_checkpoint_resumes_the_multipliers_exactly(tmp_path):
    whole = Model()
    _trainer(max_epochs=3).fit(whole, _loader())
    first = _trainer(max_epochs=1)
    first.fit(Model(), _loader())
    first.save_checkpoint(tmp_path / "epoch1.ckpt")
    resumed = Model()
    with torch.no_grad():  # another start, which the checkpoint must overwrite
        resumed.head.weight.add_(1.0)
    _trainer(max_epochs=3).fit(resumed, _loader(), ckpt_path=tmp_path / "epoch1.ckpt")
    assert torch.equal(resumed.update.multipliers()["descent"], whole.update.multipliers()["descent"])
    assert torch.equal(resumed.head.weight, whole.head.weight)


def test_a_checkpoint_without_the_multipliers_is_refused_in_one_line(tmp_path):
    import layerdescent as ld

    trainer = _trainer(max_epochs=1)
    trainer.fit(Model(), _loader())
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    checkpoint = torch.load(tmp_path / "run.ckpt", weights_only=False)
    del checkpoint["layerdescent"]
    torch.save(checkpoint, tmp_path / "plain.ckpt")
    with pytest.raises(ld.CheckpointError, match="not saved by a DescentModule, so its multipliers are unknown"):
        _trainer(max_epochs=2).fit(Model(), _loader(), ckpt_path=tmp_path / "plain.ckpt")


def test_bf16_mixed_precision_on_cpu_trains_with_float32_multipliers():
    model, callback = Model(), _callback()
    _trainer(max_epochs=1, precision="bf16-mixed").fit(model, _loader())
    _trainer(max_epochs=1, precision="bf16-mixed", callbacks=[callback]).fit(Plain(), _loader())  # the callback too
    for lam in (model.update.multipliers()["descent"], callback.update.multipliers()["descent"]):
        assert lam.dtype == torch.float32 and bool(torch.isfinite(lam).all()) and bool((lam > 0).any())


def test_two_pass_schemes_take_the_closure_through_lightning():
    model = Model(scheme="alternating-primal-dual")
    _trainer(max_epochs=1).fit(model, _loader())
    assert bool(torch.isfinite(model.update.multipliers()["descent"]).all())


def test_layer_losses_of_the_wrong_width_and_bad_options_are_one_line():
    import layerdescent as ld

    class Wide(Model):
        def layer_losses(self, batch, batch_idx):
            return super().layer_losses(batch, batch_idx)[:, :3]

    with pytest.raises(ld.PluginError, match=r"returned shape \(32, 3\) of torch.float32; it must return B x 5"):
        _trainer(max_epochs=1).fit(Wide(), _loader())
    with pytest.raises(ld.ConfigError, match="scheme"):
        Model(scheme="sideways")


def test_docs_lightning_example_runs_as_written():
    namespace: dict = {}
    exec(compile(docs_block("lightning-example", REPO / "docs" / "own-loop.md"), "docs/own-loop.md:lightning", "exec"), namespace)
    trainer, model = namespace["trainer"], namespace["model"]
    assert trainer.global_step > 0 and bool((model.update.multipliers()["descent"] >= 0).all())


def _callback(**options):
    import layerdescent as ld

    return ld.DescentCallback([ld.Descent(alpha=0.05)], num_layers=4, **{"dual_lr": 0.5, **options})


def _plain_loop(epochs: int, accumulate: int = 1, clip: float | None = None, scheduler=None):
    """LayerwiseUpdate in a loop of one's own: what the callback must reproduce (the multipliers, the weights, the learning rate)."""
    import layerdescent as ld

    blocks, head = make_blocks()
    params = [*blocks.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-2)
    schedule = scheduler(optimizer) if scheduler else None
    update = ld.LayerwiseUpdate([ld.Descent(alpha=0.05)], num_layers=4, optimizer=optimizer, dual_lr=0.5)
    for _ in range(epochs):
        batches = list(_loader())
        for start in range(0, len(batches), accumulate):
            update.zero_grad()
            for x, y in batches[start : start + accumulate]:
                update.backward(per_layer(blocks, head, x, y), weight=1 / accumulate)
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(params, clip)
            update.step()
            if schedule is not None:
                schedule.step()
    return update, head, optimizer


def test_the_callback_on_an_unmodified_module_takes_the_steps_of_layerwise_update():
    callback, model = _callback(), Plain()
    trainer = _trainer(max_epochs=2, callbacks=[callback])
    trainer.fit(model, _loader())
    update, head, _ = _plain_loop(2)
    assert trainer.global_step == 16
    expected = update.multipliers()["descent"]
    assert bool((expected > 0).any())
    torch.testing.assert_close(callback.update.multipliers()["descent"], expected)
    torch.testing.assert_close(model.head.weight, head.weight)
    assert "training_step" not in vars(model)  # the module has its own step back


def test_the_callback_under_accumulation_clipping_and_a_per_step_scheduler_follows_the_plain_loop():
    def halving(optimizer):
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    callback, model = _callback(), Plain(scheduler=halving)
    trainer = _trainer(max_epochs=2, callbacks=[callback], accumulate_grad_batches=2, gradient_clip_val=0.05)
    trainer.fit(model, _loader())
    update, head, optimizer = _plain_loop(2, accumulate=2, clip=0.05, scheduler=halving)
    assert trainer.global_step == 8  # 16 batches, 2 a step
    assert trainer.optimizers[0].param_groups[0]["lr"] == optimizer.param_groups[0]["lr"] == 1e-2 * 0.5**8  # it moved
    torch.testing.assert_close(callback.update.multipliers()["descent"], update.multipliers()["descent"])
    torch.testing.assert_close(model.head.weight, head.weight)


def test_ddp_on_two_cpu_processes_with_the_callback_follows_one_process(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    one = run_script(RUNNER, tmp_path / "one", 1, "64", "callback")
    two = run_script(RUNNER, tmp_path / "two", 2, "64", "callback", torchrun=True)
    assert one[0]["steps"] == two[0]["steps"] == 8
    assert two[0]["lambda"] == two[1]["lambda"]
    torch.testing.assert_close(torch.tensor(two[0]["lambda"]), torch.tensor(one[0]["lambda"]))
    torch.testing.assert_close(torch.tensor(two[0]["head"]), torch.tensor(one[0]["head"]))


def test_the_callbacks_multipliers_resume_exactly_from_a_checkpoint_in_mid_training(tmp_path):
    whole, whole_model = _callback(), Plain()
    _trainer(max_epochs=3, callbacks=[whole]).fit(whole_model, _loader())
    first = _trainer(max_epochs=1, callbacks=[_callback()])
    first.fit(Plain(), _loader())
    first.save_checkpoint(tmp_path / "epoch1.ckpt")
    resumed, resumed_model = _callback(), Plain()
    with torch.no_grad():  # another start, which the checkpoint must overwrite
        resumed_model.head.weight.add_(1.0)
    _trainer(max_epochs=3, callbacks=[resumed]).fit(resumed_model, _loader(), ckpt_path=tmp_path / "epoch1.ckpt")
    assert torch.equal(resumed.update.multipliers()["descent"], whole.update.multipliers()["descent"])
    assert torch.equal(resumed_model.head.weight, whole_model.head.weight)
    # a checkpoint saved without the callback would restart the multipliers at 0: refused in one line
    plain = _trainer(max_epochs=1)
    plain.fit(Model(), _loader())
    plain.save_checkpoint(tmp_path / "module.ckpt")
    import layerdescent as ld

    with pytest.raises(ld.CheckpointError, match="holds no DescentCallback state"):
        _trainer(max_epochs=2, callbacks=[_callback()]).fit(Plain(), _loader(), ckpt_path=tmp_path / "module.ckpt")


def test_the_callback_refuses_what_it_cannot_do_in_one_line():
    import layerdescent as ld

    with pytest.raises(
        ld.ConfigError, match="steps the multipliers after Lightning's own optimizer step, which needs scheme = 'simultaneous'"
    ):
        _callback(scheme="alternating-primal-dual")
    with pytest.raises(ld.ConfigError, match="Model optimizes manually: drop the callback"):
        _trainer(max_epochs=1, callbacks=[_callback()]).fit(Model(), _loader())

    class Narrow(Plain):
        def training_step(self, batch, batch_idx):
            return per_layer(self.blocks, self.head, *batch)[:, :3]

    with pytest.raises(ld.PluginError, match=r"Narrow.training_step returned shape \(32, 3\) of torch.float32; it must return B x 5"):
        _trainer(max_epochs=1, callbacks=[_callback()]).fit(Narrow(), _loader())


def test_a_scheduler_under_descent_module_steps_with_its_steps_and_a_plateau_one_is_refused():
    import layerdescent as ld

    class Scheduled(Model):
        def configure_optimizers(self):
            optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5), "interval": "step"},
            }

    trainer = _trainer(max_epochs=1)
    trainer.fit(Scheduled(), _loader())
    assert trainer.global_step == 8 and trainer.optimizers[0].param_groups[0]["lr"] == 1e-2 * 0.5**8

    class Plateau(Model):
        def configure_optimizers(self):
            optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer), "monitor": "train/loss/l4"},
            }

    with pytest.raises(ld.ConfigError, match="returned ReduceLROnPlateau, which reads a monitored metric"):
        _trainer(max_epochs=1).fit(Plateau(), _loader())


def test_docs_callback_example_trains_with_its_scheduler_and_accumulation():
    namespace: dict = {}
    exec(compile(docs_block("lightning-callback-example", REPO / "docs" / "own-loop.md"), "docs/own-loop.md:callback", "exec"), namespace)
    trainer, descent = namespace["trainer"], namespace["descent"]
    assert trainer.global_step == 12  # 8 batches an epoch, 2 a step, 3 epochs
    assert trainer.optimizers[0].param_groups[0]["lr"] == 1e-2 * 0.5  # StepLR halved it at step 10
    assert bool((descent.update.multipliers()["descent"] >= 0).all())
    assert "train/lambda/descent/l1_le_l0_step" in trainer.progress_bar_metrics  # progress_bar=True


def test_docs_lightning_cli_config_trains_the_callback_from_yaml(tmp_path, monkeypatch):
    pytest.importorskip("jsonargparse", reason="LightningCLI needs jsonargparse (pip install 'layerdescent[lightning]')")
    from lightning.pytorch.cli import LightningCLI

    page = REPO / "docs" / "own-loop.md"
    (tmp_path / "model.py").write_text(docs_block("lightning-cli-model", page))
    (tmp_path / "config.yaml").write_text(docs_block("lightning-cli-config", page, "yaml"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    cli = LightningCLI(args=["fit", "--config", "config.yaml"], save_config_callback=None)
    descent = next(c for c in cli.trainer.callbacks if type(c).__name__ == "DescentCallback")
    assert cli.trainer.global_step == 16 and descent.update.solver.options.dual_lr == 0.5
    assert bool((descent.update.multipliers()["descent"] > 0).any())


def test_docs_cooper_lightning_example_steps_the_multipliers_once_a_step():
    namespace: dict = {}
    exec(compile(docs_block("cooper-lightning-example", REPO / "docs" / "own-loop.md"), "docs/own-loop.md:cooper", "exec"), namespace)
    trainer, model = namespace["trainer"], namespace["model"]
    lam = model.cmp.descent.multiplier.weight
    assert trainer.global_step == 24 and bool((lam >= 0).all()) and bool((lam > 0).any())


def test_the_callback_logs_its_settings_as_hyperparameters(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    trainer = _trainer(max_epochs=1, callbacks=[_callback()], logger=CSVLogger(tmp_path))
    trainer.fit(Plain(), _loader())
    saved = (tmp_path / "lightning_logs" / "version_0" / "hparams.yaml").read_text()
    assert "layerdescent:" in saved and "dual_lr: 0.5" in saved and "kind: descent" in saved and "alpha: 0.05" in saved
    assert "reference: detached" in saved and "!!python" not in saved  # a Choice is written as its string
