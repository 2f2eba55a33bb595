"""Solvers are registered plugins; each option of primal-dual changes what it should, and nothing else."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pytest
import torch

import layerdescent as ld
from layerdescent import Descent, hookimpl
from layerdescent.core.grouping import LayerBatch
from layerdescent.registry import Registry
from layerdescent.run.trainer import Trainer


@dataclass(frozen=True)
class RampOptions:
    """``ramp``'s keys."""

    steps: int = 4  # the intermediate layers' weight grows from 0 to 1 over this many steps

    def __post_init__(self):
        if self.steps < 1:
            raise ld.ConfigError(f"solver.steps must be >= 1, got {self.steps}")


class Ramp(ld.Solver):
    """A fixed-schedule penalty: the last layer plus a weight that ramps up on the mean of the others."""

    name = "ramp"
    Options = RampOptions
    reference = True

    def __init__(self, options, problem):
        super().__init__(options, problem)
        self.steps_seen = 0

    def objective(self, means):
        weight = min(self.steps_seen / self.options.steps, 1.0)
        return means[-1] + weight * means[:-1].mean()

    def observe(self, seen):
        self.steps_seen += 1
        return False

    def state_dict(self):
        return {"steps_seen": self.steps_seen}

    def load_state_dict(self, state):
        self.steps_seen = state["steps_seen"]


class RampPlugin:
    @hookimpl
    def register_solvers(self, register):
        register(Ramp)


@pytest.fixture
def ramp_registry():
    return Registry(extra_plugins=[("ramp-plugin", RampPlugin())])


def test_a_plugin_solver_trains_from_toml_alone_and_keeps_its_schedule_across_a_resume(tiny, tmp_path, ramp_registry, monkeypatch):
    tiny["solver"] = {"name": "ramp", "steps": 3}
    config = ld.config_from_dict(tiny, ramp_registry)
    results = ld.train(config, tmp_path / "run", registry=ramp_registry)
    assert results["solver"] == "ramp" and results["constraints"]["descent"]["lambda"] == [0.0] * 4
    assert 'name = "ramp"' in (tmp_path / "run" / "config.toml").read_text()
    seen = []
    original = Ramp.observe
    monkeypatch.setattr(Ramp, "observe", lambda self, step: seen.append(self.steps_seen) or original(self, step))
    ld.train(config, tmp_path / "again", registry=ramp_registry)
    assert seen == list(range(len(seen))) and len(seen) == results["train"]["steps"]


def test_a_plugin_solver_runs_in_a_bench_beside_the_built_ins(tiny, tmp_path, ramp_registry):
    import tomli_w

    from layerdescent.bench.runner import run_bench

    bench = {
        **copy.deepcopy(tiny),
        "bench": {"seeds": [0], "variants": {"erm": {"solver": {"name": "erm"}}, "ramp": {"solver": {"name": "ramp"}}}},
    }
    path = tmp_path / "bench.toml"
    path.write_text(tomli_w.dumps(bench))
    run_bench(path, tmp_path / "out", registry=ramp_registry)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| ramp |" in summary and "| erm |" in summary


@pytest.mark.parametrize(
    "solver, message",
    [
        (
            {"name": "primal-dual", "dual_lrr": 1.0},
            r"^unknown key solver.dual_lrr; did you mean 'dual_lr'\? \(solver 'primal-dual' accepts: .*\)$",
        ),
        ({"name": "primal-dual", "scheme": "alternate"}, r"^solver.scheme = 'alternate' is not allowed; did you mean 'alternating'\?"),
        ({"name": "primal-dual", "dual_lr": "fast"}, r"^solver.dual_lr must be a number, got 'fast'$"),
        ({"name": "primal-dual", "penalty_growth": 0.5}, r"^solver.penalty_growth must be >= 1"),
        ({"name": "primal-dal"}, r"^solver.name = 'primal-dal' is not a registered solver; did you mean 'primal-dual'\?"),
        ({"name": "ramp", "steps": 0}, r"^solver: solver.steps must be >= 1, got 0$|^solver.steps must be >= 1, got 0$"),
        ({"name": "ramp", "step": 2}, r"^unknown key solver.step; did you mean 'steps'\? \(solver 'ramp' accepts: steps\)$"),
    ],
)
def test_a_solver_option_is_checked_like_any_config_key(tiny, ramp_registry, solver, message):
    tiny["solver"] = solver
    with pytest.raises(ld.ConfigError, match=message):
        ld.config_from_dict(tiny, ramp_registry)


def test_a_solver_option_mistake_is_one_line_and_exit_2_from_the_cli(tiny, tmp_path, capsys):
    import tomli_w

    from layerdescent.cli import main

    tiny["solver"] = {"name": "primal-dual", "dual_lrr": 1.0}
    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(tiny))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "solver.dual_lrr" in err[0] and "'dual_lr'" in err[0]
    assert not (tmp_path / "out").exists()


def test_keys_of_another_solver_are_dropped_so_a_bench_base_table_serves_every_variant(tiny):
    tiny["solver"] = {"name": "erm", "dual_lr": 1.0, "scheme": "alternating"}
    config = ld.config_from_dict(tiny)
    assert config.as_dict()["solver"] == {"name": "erm"}


def test_list_shows_each_solver_with_its_options_and_plugin(capsys, monkeypatch, ramp_registry):
    from layerdescent import cli
    from layerdescent.cli import listing

    monkeypatch.setattr(listing, "get_registry", lambda: ramp_registry)
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("solvers:") :]
    assert "primal-dual" in section and "[plugin layerdescent.core.solvers]" in section
    assert '    scheme = "simultaneous"' in section and "    dual_lr = 0.05" in section
    assert "ramp" in section and "[plugin ramp-plugin]" in section and "    steps = 4" in section


# --- what each primal-dual option does -------------------------------------------------------


def _trainer(tiny, tmp_path, **solver) -> tuple[Trainer, object]:
    tiny["solver"] = {"name": "primal-dual", "dual_lr": 1.0, **solver}
    trainer = Trainer(ld.config_from_dict(tiny), tmp_path / "run")
    return trainer, trainer.setup()


def _batches(session, n, size=64):
    order = torch.randperm(len(session.rows["train"]), generator=torch.Generator().manual_seed(0))
    return [order[i * size : (i + 1) * size] for i in range(n)]


def _multipliers_after(tiny, tmp_path, steps, **solver):
    trainer, session = _trainer(tiny, tmp_path, **solver)
    history = []
    for n, idx in enumerate(_batches(session, steps)):
        trainer.step(session, [idx], n)
        history.append(session.update.multipliers()["descent"].clone())
    return history, session


def test_nupi_moves_the_multipliers_differently_from_sgd_on_the_same_steps(tiny, tmp_path):
    sgd, _ = _multipliers_after(copy.deepcopy(tiny), tmp_path / "sgd", 4)
    nupi, _ = _multipliers_after(copy.deepcopy(tiny), tmp_path / "nupi", 4, dual_optimizer="nupi", nupi_kp=5.0)
    assert not torch.equal(torch.stack(sgd), torch.stack(nupi))


def test_alternating_takes_its_primal_step_with_the_updated_multipliers(tiny, tmp_path):
    # From lambda = 0, simultaneous's first primal step sees no constraint term; alternating's
    # sees lambda_1 (already raised by this batch's violations), so its model moves differently.
    tiny["train"]["lr"] = 0.05
    tiny["constraints"] = [{"kind": "descent", "alpha": 0.5}]  # violated from the start
    models = {}
    for scheme in ("simultaneous", "alternating"):
        trainer, session = _trainer(copy.deepcopy(tiny), tmp_path / scheme, scheme=scheme)
        idx = _batches(session, 1)[0]
        with torch.no_grad():
            before = session.problem.multipliers()["descent"].clone()
        trainer.step(session, [idx], 0)
        models[scheme] = torch.cat([p.detach().flatten() for p in session.model.parameters()])
        assert torch.equal(before, torch.zeros_like(before))
        lam = session.update.multipliers()["descent"]
        assert bool((lam > 0).any())  # both raised lambda from the same violations
    assert not torch.equal(models["simultaneous"], models["alternating"])


def test_alternating_with_accumulated_micro_batches_is_refused_with_what_to_set(tiny, tmp_path):
    tiny["train"]["accumulate"] = 2
    trainer, session = _trainer(tiny, tmp_path, scheme="alternating")
    with pytest.raises(ld.ConfigError, match=r"train.accumulate = 1"):
        trainer.step(session, _batches(session, 2, 32), 0)


def test_alternating_primal_dual_reads_the_batch_again_after_the_primal_step_without_gradients(tiny, tmp_path, monkeypatch):
    trainer, session = _trainer(tiny, tmp_path, scheme="alternating-primal-dual")
    calls = []
    original = type(trainer.task._task).layer_losses

    def counted(self, model, batch, gamma=0.0):
        calls.append(torch.is_grad_enabled())
        return original(self, model, batch, gamma)

    monkeypatch.setattr(type(trainer.task._task), "layer_losses", counted)
    trainer.step(session, _batches(session, 1), 0)
    assert calls == [True, False]


def test_extrapolation_evaluates_each_step_twice_with_cooper_extragradient_optimizers(tiny, tmp_path, monkeypatch):
    import cooper

    trainer, session = _trainer(tiny, tmp_path, scheme="extrapolation")
    assert isinstance(session.update.optimizer, cooper.optim.ExtrapolationConstrainedOptimizer)
    calls = []
    original = type(trainer.task._task).layer_losses
    monkeypatch.setattr(type(trainer.task._task), "layer_losses", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    trainer.step(session, _batches(session, 1), 0)
    assert len(calls) == 2


def test_extrapolation_with_adamw_is_refused_with_what_to_write(tiny, tmp_path):
    tiny["train"]["optimizer"] = "adamw"
    with pytest.raises(ld.ConfigError, match=r"train.optimizer = 'adam'"):
        _trainer(tiny, tmp_path, scheme="extrapolation")


def test_augmented_lagrangian_grows_its_penalty_by_the_schedule_while_a_constraint_is_violated():
    update = ld.LayerwiseUpdate(
        [Descent(alpha=0.0)],
        num_layers=2,
        optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1),
        formulation="augmented-lagrangian",
        penalty_coefficient=2.0,
        penalty_growth=1.5,
        dual_lr=1.0,
    )
    for _ in range(3):
        update.zero_grad()
        update.forward(torch.tensor([1.0, 2.0, 0.5]))  # l1 violated (by 1), l2 met
        update.step()
    assert update.record()["penalty"]["descent"] == pytest.approx([2.0 * 1.5**3, 2.0])


def test_augmented_lagrangian_adds_the_quadratic_term_to_the_primal_loss():
    def loss(**options):
        update = ld.LayerwiseUpdate(
            [Descent(alpha=0.0)], num_layers=1, optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), **options
        )
        return update.forward(torch.tensor([1.0, 3.0])).item()  # violation 2, lambda 0

    assert loss() == 3.0  # the Lagrangian at lambda = 0 is the objective
    # Cooper's augmented term at lambda = 0: relu(rho g)^2 / (2 rho) = rho g^2 / 2
    assert loss(formulation="augmented-lagrangian", penalty_coefficient=0.5) == pytest.approx(3.0 + 0.5 * 4 / 2)


@pytest.mark.parametrize("formulation", ["lagrangian", "augmented-lagrangian", "lagrangian, per sample"])
def test_the_dual_gradient_is_the_backward_of_cooper_dual_lagrangian(formulation):
    # The update writes it without an autograd pass; Cooper's own dual Lagrangian must agree, entry for entry,
    # a resilient per-sample spec's relaxed violation g - lambda / c at the rows seen included.
    specs = [Descent(alpha=0.1, layers=(1, 3)), Descent(name="strict", alpha=0.3, reference="live", resilience=2.0), ld.Bound(value=0.5)]
    if formulation.endswith("per sample"):
        specs.append(Descent(name="rows", alpha=0.05, per_sample=True, resilience=4.0))
    update = ld.LayerwiseUpdate(
        specs,
        num_layers=3,
        optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1),
        formulation=formulation.split(",")[0],
        dual_lr=1.0,
        rows=10,
    )
    if formulation.endswith("per sample"):
        update.problem.constraints[specs[-1].name].multiplier.weight.data = torch.rand(30, 1, generator=torch.Generator().manual_seed(1))
    losses = torch.rand(4, 4, generator=torch.Generator().manual_seed(0))
    batch = LayerBatch(losses, torch.tensor([7, 2, 5, 0]), torch.zeros(4, dtype=torch.long))
    with torch.no_grad():
        state = update.problem.cmp.compute_cmp_state(batch, primal=False)
    update.solver.dual_gradient(state.misc["violations"], state.misc["tables"])  # what a dual step of training writes
    written = {spec.name: update.problem.constraints[spec.name].multiplier.weight.grad.clone() for spec in specs}
    for multiplier in update.problem.cmp.multipliers():
        multiplier.weight.grad = None
    state.compute_dual_lagrangian().lagrangian.backward()
    for spec in specs:
        cooper_ = update.problem.constraints[spec.name].multiplier.weight.grad
        assert torch.equal(written[spec.name].to_dense(), cooper_.to_dense()), spec.name
    assert not torch.equal(written["descent"], torch.zeros(2))
    if formulation.endswith("per sample"):  # only the rows seen move, by their relaxed violation
        assert sorted(written["rows"].coalesce().indices()[0].tolist()) == [0, 1, 2, 6, 7, 8, 15, 16, 17, 21, 22, 23]


@pytest.mark.parametrize("formulation", ["lagrangian", "augmented-lagrangian"])
def test_the_primal_loss_a_micro_batch_backpropagates_is_the_lagrangian_written_out(formulation):
    # Cooper computes it; here it is written out by hand: f + lambda . g, plus rho/2 relu(g + lambda/rho)^2 - lambda^2/(2 rho)
    # for the augmented Lagrangian (Cooper's compute_primal_quadratic_augmented_contribution) at rho = 0.5.
    specs = [Descent(alpha=0.1, layers=(1, 3)), Descent(name="strict", alpha=0.3, reference="live", resilience=2.0), ld.Bound(value=0.5)]
    options = {"penalty_coefficient": 0.5} if formulation == "augmented-lagrangian" else {}
    update = ld.LayerwiseUpdate(
        specs, num_layers=3, optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), formulation=formulation, **options
    )
    lambdas = [torch.tensor(values) for values in ([0.3, 1.7], [0.2, 0.0, 2.5], [0.9, 0.1, 0.4, 1.1])]
    for spec, values in zip(specs, lambdas):
        update.problem.constraints[spec.name].multiplier.weight.data = values.clone()
    losses = torch.rand(8, 4, generator=torch.Generator().manual_seed(0)).requires_grad_()
    ours = update.problem.forward(losses)  # what a micro-batch of training backpropagates
    (ours_grad,) = torch.autograd.grad(ours, losses)

    means = losses.mean(0)
    violations = update.problem.violations(means)
    by_hand = means[-1]
    for spec, lam in zip(specs, lambdas):
        g = violations[spec.name]
        by_hand = by_hand + (lam * g).sum()
        if options:
            rho = options["penalty_coefficient"]
            by_hand = by_hand + (rho / 2 * torch.relu(g + lam / rho) ** 2 - lam**2 / (2 * rho) - lam * g).sum()
    (hand_grad,) = torch.autograd.grad(by_hand, losses)
    assert torch.allclose(ours, by_hand, rtol=1e-6, atol=1e-6) and torch.allclose(ours_grad, hand_grad, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ours, means[-1])  # the multipliers weigh in


@pytest.mark.parametrize("formulation", ["lagrangian", "augmented-lagrangian"])
@pytest.mark.parametrize("scheme", ["simultaneous", "alternating", "alternating-primal-dual", "extrapolation"])
def test_every_formulation_and_scheme_trains_and_resumes_on_the_same_trajectory(tiny, tmp_path, monkeypatch, formulation, scheme):
    tiny["solver"].update(formulation=formulation, scheme=scheme, penalty_growth=1.01)
    if scheme == "extrapolation":
        tiny["train"]["optimizer"] = "sgd"  # both extragradient optimizers, ExtraSGD's state included
    tiny["train"].update(epochs=2, checkpoint_every=3)
    config = ld.config_from_dict(tiny)
    whole = ld.train(config, tmp_path / "whole")
    assert all(math.isfinite(v) for g in whole["gammas"] for v in g["layer_loss"])
    original, calls = Trainer.step, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 11:  # after the checkpoint at step 9, mid-epoch
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ld.train(config, tmp_path / "resumed")
    monkeypatch.setattr(Trainer, "step", original)
    resumed = ld.train(config, tmp_path / "resumed", resume=True)
    assert resumed["gammas"] == whole["gammas"] and resumed["constraints"] == whole["constraints"]
    assert (tmp_path / "whole" / "metrics.jsonl").read_text() == (tmp_path / "resumed" / "metrics.jsonl").read_text()


# --- the update object in a plain loop -------------------------------------------------------


def _toy(seed=0):
    torch.manual_seed(seed)
    layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
    head = torch.nn.Linear(4, 1)
    return layers, head


def _losses(layers, head, x, y):
    h, losses = x, [((head(x) - y) ** 2).squeeze(1)]
    for layer in layers:
        h = h + torch.tanh(layer(h))
        losses.append(((head(h) - y) ** 2).squeeze(1))
    return torch.stack(losses, 1)


def test_accumulated_micro_batches_give_the_step_of_the_whole_batch():
    x, y = torch.randn(64, 4, generator=torch.Generator().manual_seed(1)), torch.randn(64, 1, generator=torch.Generator().manual_seed(2))
    results = []
    for chunks in (1, 4):
        layers, head = _toy()
        params = [*layers.parameters(), *head.parameters()]
        update = ld.LayerwiseUpdate([Descent(alpha=0.3)], num_layers=3, optimizer=torch.optim.SGD(params, lr=0.1), dual_lr=1.0)
        for _ in range(3):
            update.zero_grad()
            for xs, ys in zip(x.chunk(chunks), y.chunk(chunks)):
                update.backward(_losses(layers, head, xs, ys), weight=1 / chunks)
            update.step()
        results.append((update.multipliers()["descent"], torch.cat([p.detach().flatten() for p in params])))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-6) and bool((results[0][0] > 0).any())
    assert torch.allclose(results[0][1], results[1][1], atol=1e-6)


@pytest.mark.parametrize("solver", ["erm", "penalty", "primal-dual"])
def test_a_step_with_a_non_finite_loss_is_not_taken_and_says_which_value(solver):
    layers, head = _toy()
    params = [*layers.parameters(), *head.parameters()]
    update = ld.LayerwiseUpdate([Descent(alpha=0.3)], num_layers=3, optimizer=torch.optim.SGD(params, lr=0.1), solver=solver, dual_lr=1.0)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    losses = _losses(layers, head, x, y)
    update.zero_grad()
    update.backward(torch.cat([losses[:, :3], losses[:, 3:] * float("nan")], dim=1))  # the last layer's loss is NaN
    before = [p.detach().clone() for p in params]
    seen = update.step()
    assert seen.skipped == "non-finite loss, l3 = nan" and seen.stop is None
    assert all(torch.equal(a, b) for a, b in zip(before, params)) and all(p.grad is None for p in params)
    assert update.line.steps == 0 and torch.equal(update.multipliers()["descent"], torch.zeros(3))
    update.zero_grad()
    update.backward(_losses(layers, head, x, y))
    assert update.step().skipped is None and update.line.steps == 1  # the next step is taken as usual


def test_a_last_layer_read_alone_is_checked_on_that_layer_and_logged_as_it():
    layers, head = _toy()
    params = [*layers.parameters(), *head.parameters()]
    update = ld.LayerwiseUpdate([Descent(alpha=0.3)], num_layers=3, optimizer=torch.optim.SGD(params, lr=0.1), solver="erm")
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    update.zero_grad()
    update.backward(_losses(layers, head, x, y)[:, 3:])  # B x 1: the last layer's losses alone
    seen = update.step()
    assert seen.skipped is None and not seen.every_layer and bool(seen.means[:3].isnan().all())
    assert update.record()["loss"][:3] == [None, None, None]  # no step read them: null, not a mean of nothing
    update.zero_grad()
    update.backward(_losses(layers, head, x, y)[:, 3:] * float("nan"))
    assert update.step().skipped == "non-finite loss, l3 = nan"


def test_a_multiplier_past_max_multiplier_is_reported_as_a_stop_naming_the_entry():
    layers, head = _toy()
    params = [*layers.parameters(), *head.parameters()]
    update = ld.LayerwiseUpdate(
        [Descent(alpha=0.9)], num_layers=3, optimizer=torch.optim.SGD(params, lr=0.1), dual_lr=100.0, max_multiplier=1.0
    )
    update.zero_grad()
    update.backward(_losses(layers, head, torch.randn(16, 4), torch.randn(16, 1)))
    seen = update.step()
    assert seen.skipped is None and seen.stop.startswith("multiplier of constraint 'descent' exploded, l")
    assert "> solver.max_multiplier = 1" in seen.stop


def test_the_update_state_round_trips_so_a_loop_resumes_on_the_same_multipliers():
    layers, head = _toy()
    params = [*layers.parameters(), *head.parameters()]
    make = lambda: ld.LayerwiseUpdate(
        [Descent(alpha=0.3)], num_layers=3, optimizer=torch.optim.Adam(params, lr=0.01), dual_lr=1.0, dual_every=2
    )
    update = make()
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(3):  # an odd number: the dual window holds one step when saved
        update.zero_grad()
        update.backward(_losses(layers, head, x, y))
        update.step()
    copy_ = make()
    copy_.load_state_dict(update.state_dict())
    for u in (update, copy_):
        u.zero_grad()
        u.forward(torch.tensor([1.0, 2.0, 1.0, 1.0]))
        u.step()
    assert torch.equal(update.multipliers()["descent"], copy_.multipliers()["descent"])


def test_a_two_step_scheme_without_a_closure_says_what_to_pass():
    layers, head = _toy()
    update = ld.LayerwiseUpdate(
        [Descent()], num_layers=3, optimizer=torch.optim.SGD(head.parameters(), lr=0.1), scheme="alternating-primal-dual"
    )
    update.backward(_losses(layers, head, torch.randn(8, 4), torch.randn(8, 1)))
    with pytest.raises(TypeError, match=r"pass step\(closure\)"):
        update.step()


def test_cooper_roll_steps_the_model_and_lambda_from_the_layerwise_cmp_state():
    # Cooper's own roll() calls compute_cmp_state with a closure; the layerwise CMP builds the state from it.
    layers, head = _toy()
    params = [*layers.parameters(), *head.parameters()]
    update = ld.LayerwiseUpdate([Descent(alpha=0.3)], num_layers=3, optimizer=torch.optim.SGD(params, lr=0.1), dual_lr=1.0)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    before = [p.detach().clone() for p in params]
    roll = update.optimizer.roll({"layer_losses": lambda: _losses(layers, head, x, y)})
    violation = next(iter(roll.cmp_state.observed_constraints.values())).violation.detach()
    assert torch.allclose(update.multipliers()["descent"], violation.clamp(min=0))  # one ascent step of size 1 from 0
    assert roll.loss.item() == pytest.approx(_losses(*_toy(), x, y).mean(0)[-1].item())  # the objective: the last layer
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, params))


@pytest.mark.parametrize("formulation", ["lagrangian", "augmented-lagrangian"])
@pytest.mark.parametrize("scheme", ["simultaneous", "alternating", "alternating-primal-dual", "extrapolation"])
def test_every_scheme_takes_the_steps_cooper_roll_takes_on_the_same_cmp(scheme, formulation):
    # Training counts each micro-batch through the problem and steps through the scheme (the shortcut
    # beside Cooper's roll(): no per-step stores, the dual gradient written directly); Cooper's own roll()
    # on the same CMP must end at the same model and multipliers, bit for bit.
    train = ld.config_from_dict({"task": {"name": "lista"}, "train": {"optimizer": "sgd", "lr": 0.02, "momentum": 0.5}}).train
    runs = []
    for _ in range(2):
        layers, head = _toy()
        params = [*layers.parameters(), *head.parameters()]
        primal = ld.PrimalDual.scheme_of(ld.PrimalDualOptions(scheme=scheme)).primal_optimizer(params, train)
        specs = [Descent(alpha=0.3), ld.Bound(name="cap", value=0.9)]
        update = ld.LayerwiseUpdate(specs, num_layers=3, optimizer=primal, scheme=scheme, formulation=formulation, dual_lr=0.5)
        runs.append((layers, head, params, update))
    (layers, head, params, ours), (layers_, head_, params_, theirs) = runs
    data = torch.Generator().manual_seed(3)
    for _ in range(6):
        x, y = torch.randn(32, 4, generator=data), torch.randn(32, 1, generator=data)

        def again(layers=layers, head=head, x=x, y=y):
            return ours.backward(_losses(layers, head, x, y))

        ours.zero_grad()
        again()
        seen = ours.step(again)
        theirs.optimizer.roll({"layer_losses": lambda x=x, y=y: _losses(layers_, head_, x, y)})
        assert seen.skipped is None and seen.stop is None
    assert all(torch.equal(a, b) for a, b in zip(params, params_))
    for name, value in ours.multipliers().items():
        assert torch.equal(value, theirs.multipliers()[name]), name
    assert ours.multipliers()["descent"].gt(0).any()  # the multipliers moved


@pytest.mark.parametrize("solver", ["erm", "primal-dual"])
def test_record_returns_the_whole_log_line_means_over_its_steps_under_every_solver(solver):
    layers, head = _toy()
    update = ld.LayerwiseUpdate(
        [Descent(alpha=0.3)],
        num_layers=3,
        optimizer=torch.optim.SGD([*layers.parameters(), *head.parameters()], lr=0.1),
        solver=solver,
        dual_lr=1.0,
    )
    steps = []
    for seed in range(3):
        x, y = (
            torch.randn(16, 4, generator=torch.Generator().manual_seed(seed)),
            torch.randn(16, 1, generator=torch.Generator().manual_seed(seed + 10)),
        )
        update.zero_grad()
        losses = _losses(layers, head, x, y)
        update.backward(losses)
        means = losses.detach().mean(0)  # what the line averages, computed here independently
        steps.append((means, update.problem.violations(means)["descent"]))
        update.step()
    line = update.record()
    assert set(line) == (
        {"loss", "feasible", "violation", "lambda", "relaxation"} if solver == "primal-dual" else {"loss", "feasible", "violation"}
    )
    assert line["loss"] == pytest.approx(torch.stack([m for m, _ in steps]).mean(0).tolist())
    assert line["violation"]["descent"] == pytest.approx(torch.stack([v for _, v in steps]).mean(0).tolist())
    assert line["feasible"] == sum(bool((v <= 0).all()) for _, v in steps) / 3
    assert "loss" not in update.record()  # the next line starts empty


def test_a_dual_window_is_a_count_of_steps_or_an_epoch():
    from layerdescent.core.solvers import DualWindow

    problem = ld.LayerwiseUpdate(
        [ld.Descent()], num_layers=2, optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    ).problem
    three, epoch = DualWindow.of(3, 3), DualWindow.of("epoch", 3)
    step = ld.Observation(torch.tensor([1.0, 2.0, 1.5]))
    assert [three.add(step, problem) is not None for _ in range(4)] == [False, False, True, False] and not three.per_epoch
    assert epoch.per_epoch and all(epoch.add(step, problem) is None for _ in range(1000))  # the epoch's end closes it, never a count
    violations, _ = epoch.close(problem)
    assert torch.equal(violations["descent"], problem.violations(torch.tensor([1.0, 2.0, 1.5]))["descent"]) and epoch.count == 0


@pytest.mark.parametrize("scheme", ["simultaneous", "alternating", "alternating-primal-dual", "extrapolation"])
def test_primal_dual_reads_its_scheme_and_window_strings_once_into_types(scheme):
    from layerdescent.core.solvers import SCHEMES, DualWindow

    train = ld.config_from_dict({"task": {"name": "lista"}, "train": {"optimizer": "sgd", "lr": 0.1}}).train
    primal = ld.PrimalDual.scheme_of(ld.PrimalDualOptions(scheme=scheme)).primal_optimizer([torch.nn.Parameter(torch.zeros(1))], train)
    update = ld.LayerwiseUpdate([ld.Descent()], num_layers=2, optimizer=primal, scheme=scheme)
    window = update.solver.dual_window
    assert type(update.scheme) is SCHEMES[scheme] and isinstance(window, DualWindow) and window.steps == 1


def test_no_option_choice_is_branched_on_as_a_string_outside_its_parsing():
    import ast
    from pathlib import Path

    from layerdescent.core.constraints import Levels, Reference
    from layerdescent.core.optimizers import OptimizerName
    from layerdescent.core.solvers import DualOptimizer, Formulation, Scheme
    from layerdescent.core.window import DualEvery
    from layerdescent.run.config import LrSchedule, OnNonfinite, Precision

    typed = {
        str(m)
        for choice in (Reference, Levels, OptimizerName, DualOptimizer, Formulation, Scheme, LrSchedule, OnNonfinite, Precision)
        for m in choice
    }
    branched = {}
    root = Path(ld.__file__).parent
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        # in the core, "epoch" is dual_every's cadence (DualEvery); elsewhere it is also a log line's event
        strings = typed | {str(DualEvery.EPOCH)} if path.parent.name == "core" else typed
        # where the strings are parsed: the options' own checks
        parsing = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "__post_init__" for n in ast.walk(f)}
        lines = [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Compare)
            and id(node) not in parsing
            and any(isinstance(c, ast.Constant) and c.value in strings for c in [node.left, *node.comparators])
        ]
        if lines:
            branched[path.relative_to(root).as_posix()] = lines
    assert not branched, f"compare with the Choice member, not its string: {branched}"


def test_a_choice_is_parsed_once_where_the_config_is_read_and_written_back_as_its_string():
    from layerdescent.core.constraints import Levels, Reference
    from layerdescent.core.solvers import Scheme
    from layerdescent.core.window import DualEvery
    from layerdescent.run.config import Precision

    config = ld.config_from_dict(
        {
            "task": {"name": "lista"},
            "train": {"precision": "bf16"},
            "solver": {"name": "primal-dual", "scheme": "alternating"},
            "constraints": [{"kind": "descent", "reference": "anchored"}],
        }
    )
    assert config.train.precision is Precision.BF16 and config.solver.options.scheme is Scheme.ALTERNATING
    assert config.constraints[0].reference is Reference.ANCHORED and ld.Descent(reference="live").reference is Reference.LIVE
    table = config.as_dict()
    assert type(table["train"]["precision"]) is str and type(table["constraints"][0]["reference"]) is str
    banded = ld.config_from_dict(
        {
            "task": {"name": "lista"},
            "train": {"train_gamma": [0.0, 0.8]},
            "solver": {"name": "primal-dual", "dual_every": "epoch"},
            "constraints": [{"kind": "descent", "levels": "band"}],
        }
    )
    spec = banded.constraints[0]
    assert banded.solver.options.dual_every is DualEvery.EPOCH and spec.levels is Levels.BAND and spec.held_levels((0.0, 0.8)) == (0.0, 0.8)
    table = banded.as_dict()
    assert type(table["solver"]["dual_every"]) is str and type(table["constraints"][0]["levels"]) is str
    assert f"{Scheme.ALTERNATING}" == "alternating" and repr(config.constraints[0]).endswith("reference='anchored', anchor=None)")
    with pytest.raises(
        ld.ConfigError, match=r"train.precision = 'bf61' is not allowed; did you mean 'bf16'\? \(allowed: 'fp32' or 'bf16'\)"
    ):
        ld.config_from_dict({"task": {"name": "lista"}, "train": {"precision": "bf61"}})


def test_an_observation_is_a_frozen_value_of_what_the_step_saw_without_state_flags():
    import dataclasses

    head = torch.nn.Linear(1, 1)
    update = ld.LayerwiseUpdate([ld.Descent()], num_layers=2, optimizer=torch.optim.SGD(head.parameters(), lr=0.1))
    update.zero_grad()
    update.backward(torch.cat([head(torch.ones(4, 1)).abs() * k for k in (3.0, 2.0, 1.0)], dim=1))
    assert update.scheme.observation() is update.scheme.observation()  # the same value until the step is taken
    seen = update.step()
    assert {f.name for f in dataclasses.fields(seen)} == {"means", "violations", "tables", "micro", "every_layer", "skipped", "stop"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen.stop = "changed"
    assert seen.micro == 1 and seen.every_layer and seen.skipped is None and set(seen.violations) == {"descent"}


def test_a_dual_method_may_bring_its_own_dual_optimizer_over_the_problems_groups():
    class AdamAscent(ld.PrimalDual):
        name = "adam-ascent"

        def dual_optimizer(self):
            return torch.optim.Adam(self.problem.dual_groups(), lr=0.5, maximize=True)

    class Plugin:
        @hookimpl
        def register_solvers(self, register):
            register(AdamAscent)

    registry = Registry(extra_plugins=[("adam-ascent", Plugin())])
    head = torch.nn.Linear(1, 1)
    update = ld.LayerwiseUpdate(
        [ld.Descent()], num_layers=2, optimizer=torch.optim.SGD(head.parameters(), lr=0.01), solver="adam-ascent", registry=registry
    )
    assert isinstance(update.solver.optimizer.dual_optimizers[0], torch.optim.Adam)
    update.zero_grad()
    update.backward(torch.cat([head(torch.ones(4, 1)).abs() * k for k in (1.0, 2.0, 3.0)], dim=1))  # both transitions rise
    update.step()
    assert update.multipliers()["descent"].tolist() == pytest.approx([0.5, 0.5])  # Adam's first step is lr, whatever the gradient's size


def test_the_any_loop_front_takes_a_solver_class_and_names_only_the_built_in_solvers_without_a_registry():
    class Halved(ld.PrimalDual):
        name = "halved"  # registered nowhere

    head = torch.nn.Linear(1, 1)

    def front(solver, **options):
        return ld.LayerwiseUpdate(
            [ld.Descent()], num_layers=2, optimizer=torch.optim.SGD(head.parameters(), lr=0.01), solver=solver, **options
        )

    update = front(Halved, dual_lr=0.25)
    assert type(update.solver) is Halved and update.solver.options.dual_lr == 0.25
    assert type(front("penalty").solver) is ld.Penalty
    with pytest.raises(ld.ConfigError, match=r"solver 'halved' is not built in .*solver=MySolver.*registry=layerdescent.get_registry\(\)"):
        front("halved")
    with pytest.raises(ld.ConfigError, match="did you mean 'primal-dual'"):
        front("primal-dual2")
    with pytest.raises(ld.ConfigError, match="dual_lr"):
        front(Halved, dual_lr=-1.0)  # the class's options are checked as a name's are


def test_nupi_takes_the_first_three_updates_its_recursion_gives():
    # xi_t = nu xi_(t-1) + (1 - nu) e_t, xi_-1 = e_0; lambda_(t+1) = lambda_t + lr (Ki e_t + Kp (xi_t - xi_(t-1)))
    import cooper

    from layerdescent.core.solvers import nupi

    lr, kp, ki, nu = 0.1, 2.0, 1.0, 0.5
    errors = [torch.tensor([1.0, -2.0]), torch.tensor([3.0, 0.5]), torch.tensor([-1.0, 4.0])]
    lam, xi_before, expected = torch.zeros(2), errors[0], []
    for e in errors:
        xi = nu * xi_before + (1 - nu) * e
        lam = lam + lr * (ki * e + kp * (xi - xi_before))
        xi_before = xi
        expected.append(lam.clone())

    def updates(build):
        weight = torch.nn.Parameter(torch.zeros(2))
        optimizer, out = build([weight]), []
        for e in errors:
            weight.grad = e.clone()
            optimizer.step()
            out.append(weight.detach().clone())
        return out

    ours = updates(lambda params: nupi([{"params": params}], lr=lr, kp=kp, ki=ki, ema=nu))
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(ours[0], lr * ki * errors[0])  # the first step is SGD's
    # Cooper's own default is wrong from the second update on (cooper-org/cooper issue 107): the test can fail
    theirs = updates(lambda params: cooper.optim.nuPI(params, lr=lr, Kp=kp, Ki=ki, ema_nu=nu, maximize=True))
    assert torch.equal(theirs[0], ours[0]) and not torch.allclose(theirs[1], ours[1])


def test_the_augmented_lagrangian_refuses_a_zero_penalty_in_one_line(tiny, tmp_path, capsys):
    # Cooper's augmented Lagrangian divides by the penalty on an inequality (cooper-org/cooper issue 106)
    import tomli_w

    from layerdescent.cli import main

    tiny["solver"] = {"name": "primal-dual", "formulation": "augmented-lagrangian", "penalty_coefficient": 0.0}
    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(tiny))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["layerdescent: error: solver.penalty_coefficient must be > 0, got 0.0"]
    assert not (tmp_path / "out").exists()
