"""Per-layer loss, descent rate and task metrics at every perturbation level gamma."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import datasets
import torch

from layerdescent.core.grouping import LayerBatch, add_tables
from layerdescent.distributed import World, to_device
from layerdescent.errors import DataError, LayerdescentError, PluginError
from layerdescent.run.config import EvalConfig
from layerdescent.run.data import Rows
from layerdescent.task import Task


@torch.inference_mode()  # no autograd bookkeeping at all: the forward passes are the whole cost
def evaluate(
    task: Task,
    model: torch.nn.Module,
    dataset: datasets.Dataset | Rows,
    gammas: Iterable[float],
    batch_size: int = 256,
    seed: int = 1234,
    world: World | None = None,
    bar: Any = None,
) -> list[dict[str, Any]]:
    """One record per gamma: ``layer_loss`` (L+1), ``descent_rate`` (L), ``metrics``, ``samples``.

    A task whose outputs carry ``layer_preds`` also gets ``layer_metrics``: each metric at every layer.

    Batch k draws its perturbations from a torch RNG seeded with (``seed``, k), so the numbers
    depend neither on what ran before nor on how many ranks share the batches (rank r takes
    batches r, r + size, ...; sums are reduced over ranks), and the caller's RNG is left as it was.
    ``bar`` (a progress bar) counts this rank's batches.
    """
    world = world or World()
    rows = dataset if isinstance(dataset, Rows) else Rows(dataset)
    if len(rows) == 0:
        raise DataError("cannot evaluate on an empty dataset")
    was_training = model.training
    model.eval()
    try:
        return [_at_gamma(task, model, rows, float(gamma), batch_size, seed, world, bar) for gamma in gammas]
    finally:
        model.train(was_training)


def _at_gamma(
    task: Task, model: torch.nn.Module, rows: Rows, gamma: float, batch_size: int, seed: int, world: World, bar: Any
) -> dict[str, Any]:
    """One gamma's record: this rank's batches read out at every layer, the sums reduced over ranks."""
    device = next(model.parameters(), torch.empty(0)).device
    rng_devices = [device] if device.type == "cuda" else []
    layers = task.num_layers + 1
    metrics = task.metrics().to(device)
    per_layer = None  # one metric collection per layer, made when a batch brings layer_preds
    loss_sum = torch.zeros(layers, dtype=torch.float64, device=device)
    descents = torch.zeros(layers - 1, dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    for k, start in enumerate(range(0, len(rows), batch_size)):
        if k % world.size != world.rank:
            continue
        with torch.random.fork_rng(devices=rng_devices):
            torch.manual_seed(seed * 1_000_003 + k)
            batch = to_device(task.collate(rows[start : start + batch_size]), device)
            out = task.layer_losses(model, batch, gamma=gamma)
        if bar is not None:
            bar.update(1)
        losses = out.losses.detach().double()
        loss_sum += losses.sum(0)
        descents += (losses[:, 1:] < losses[:, :-1]).sum(0)
        count += losses.shape[0]
        if out.preds is not None:
            _update(task, metrics, out.preds, out.target)
        if out.layer_preds is not None:
            per_layer = per_layer or [task.metrics().to(device) for _ in range(layers)]
            for k, layer_metrics in enumerate(per_layer):
                layer_metrics.update(out.layer_preds[:, k], out.target)
    loss_sum, descents, count = world.sum(loss_sum), world.sum(descents), world.sum(count)
    computed = metrics.compute() if len(metrics) else {}  # torchmetrics reduces over ranks itself
    record = {
        "gamma": gamma,
        "layer_loss": (loss_sum / count).tolist(),
        "descent_rate": (descents / count).tolist(),
        "metrics": {name: float(value) for name, value in computed.items()},
        "samples": int(count.item()),
    }
    if world.size > 1 and bool(world.sum(torch.tensor(float(per_layer is not None), device=device)) > 0):
        per_layer = per_layer or [task.metrics().to(device) for _ in range(layers)]  # every rank joins the metrics' reduction
    if per_layer and len(per_layer[0]):
        layer_values = [m.compute() for m in per_layer]
        record["layer_metrics"] = {name: [float(v[name]) for v in layer_values] for name in layer_values[0]}
    return record


def _update(task: Task, metrics: Any, preds: torch.Tensor, target: torch.Tensor) -> None:
    """``metrics.update(preds, target)``, or one PluginError line naming the task whose own metrics reject its outputs."""
    try:
        metrics.update(preds, target)
    except Exception as exc:
        who = getattr(task, "_who", f"task {task.name!r}")
        raise PluginError(
            f"{who}: metrics().update with LayerOutput.preds and .target raised {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        ) from None


def domain_rows(task: Task, name: str, samples: int = 0, seed: int = 1234) -> Rows:
    """Domain ``name`` of ``task`` in memory: at most ``samples`` rows (a fixed random subset; 0 keeps all)."""
    dataset = task.domain_dataset(name)
    if not isinstance(dataset, datasets.Dataset):
        raise LayerdescentError(f"task {task.name!r}: domain_dataset({name!r}) returned {type(dataset).__name__}, not a datasets.Dataset")
    if len(dataset) == 0:
        raise DataError(f"task {task.name!r} built an empty domain {name!r}; check its data options")
    if samples and len(dataset) > samples:
        keep = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:samples]
        dataset = dataset.select(sorted(keep.tolist()))
    rows = Rows(dataset)
    rows.check_finite(f"domain {name}")
    return rows


def evaluate_all(
    task: Task,
    model: torch.nn.Module,
    rows: Rows,
    config: EvalConfig,
    world: World | None = None,
    progress: Callable[[int], Any] | None = None,
    done: dict[str, Any] | None = None,
    on_record: Callable[[dict[str, Any]], Any] | None = None,
) -> dict[str, Any]:
    """The final evaluation as ``results.json`` records it: ``gammas`` on ``rows``, ``domains`` when the config names any, its workload and wall time.

    ``progress(total)`` makes the bar that counts this rank's batches; each domain adds its own when it is read.
    ``done`` is an interrupted evaluation's partial table (what ``on_record`` was last given): its
    records are kept and evaluation resumes at the next (gamma, domain) record. ``on_record(partial)``
    is called on every rank after each record, with ``eval_seconds`` so far, for the caller to save.
    """
    world = world or World()
    done = done or {}
    sets = [("gammas", None), *((name, name) for name in config.domains)]
    kept = {key: list(done.get("gammas", []) if key == "gammas" else done.get("domains", {}).get(key, [])) for key, _ in sets}
    seconds = float(done.get("eval_seconds", 0.0))

    def batches(dataset: Rows, gammas: int) -> int:  # this rank's share: batches rank, rank + size, ...
        return len(range(world.rank, math.ceil(len(dataset) / config.batch_size), world.size)) * gammas

    def table() -> dict[str, Any]:
        out: dict[str, Any] = {"gammas": kept["gammas"]}
        if config.domains:
            out["domains"] = {name: kept[name] for name in config.domains if kept[name]}
        return out

    bar = progress(batches(rows, len(config.gammas) - len(kept["gammas"]))) if progress else None
    try:
        for key, domain in sets:
            if len(kept[key]) == len(config.gammas):
                continue  # every record of this set was taken before the interruption
            start = time.perf_counter()
            dataset = rows if domain is None else domain_rows(task, domain, config.domain_samples, config.seed)
            if bar is not None and domain is not None:
                bar.total += batches(dataset, len(config.gammas) - len(kept[key]))
            for gamma in config.gammas[len(kept[key]) :]:
                kept[key] += evaluate(task, model, dataset, [gamma], config.batch_size, config.seed, world, bar)
                seconds += time.perf_counter() - start
                start = time.perf_counter()
                if on_record is not None:
                    on_record({**table(), "eval_seconds": seconds})
    finally:
        if bar is not None:
            bar.close()
    out = table()
    out["eval_workload"] = workload(out, config)
    out["eval_seconds"] = seconds
    return out


def workload(evaluation: dict[str, Any], config: EvalConfig) -> dict[str, Any]:
    """What an evaluation computed: rows per set (the split, then each domain), gammas, records (gamma x set) and rows passed forward in all."""
    sets = {config.split: evaluation["gammas"], **evaluation.get("domains", {})}
    rows = {name: records[0]["samples"] for name, records in sets.items()}  # a record's samples are its set's rows, the same at every gamma
    gammas = len(config.gammas)
    return {"rows": rows, "gammas": gammas, "records": gammas * len(sets), "forward_rows": gammas * sum(rows.values())}


@torch.no_grad()
def rows_satisfied(
    task: Task,
    model: torch.nn.Module,
    rows: Rows,
    band: Iterable[float],
    update: Any,
    batch_size: int = 256,
    seed: int = 1234,
    world: World | None = None,
) -> dict[str, float]:
    """For each per-sample constraint, the share of training rows that meet it at the end: every entry's violation <= 0 at every level it holds.

    Each row is taken at every level of the training band (its noise seeded as ``evaluate`` seeds it);
    a row's losses are pooled over the band's levels where the constraint is not held per level.
    """
    world = world or World()
    problem = update.problem
    names = [spec.name for spec in problem.specs if spec.per_sample]
    if not names:
        return {}
    device = next(model.parameters(), torch.empty(0)).device
    rng_devices = [device] if device.type == "cuda" else []
    # every rank holds every table, batches or not, so that the sums over ranks meet
    groups = {name: problem.groupings[name].size // problem.groupings[name].entries for name in names}
    tables = {
        name: (torch.zeros(groups[name], task.num_layers + 1, device=device), torch.zeros(groups[name], device=device)) for name in names
    }
    was_training = model.training
    model.eval()
    try:
        for j, gamma in enumerate(band):
            for k, start in enumerate(range(0, len(rows), batch_size)):
                if k % world.size != world.rank:
                    continue
                index = torch.arange(start, min(start + batch_size, len(rows)))
                with torch.random.fork_rng(devices=rng_devices):
                    torch.manual_seed(seed * 1_000_003 + k)
                    batch = to_device(task.collate(rows[index]), device)
                    losses = task.layer_losses(model, batch, gamma=float(gamma)).losses.detach()
                observed = LayerBatch.of(losses, index.to(device), torch.full_like(index, j).to(device))
                tables = add_tables(tables, {name: problem.groupings[name].sums(observed) for name in names})
    finally:
        model.train(was_training)
    tables = {name: (world.sum(sums), world.sum(counts)) for name, (sums, counts) in tables.items()}
    out = {}
    for name, violation in problem.violations(tables=tables).items():
        met = (violation <= 0) | violation.isnan()  # a (row, level) the constraint does not hold at is no violation
        out[name] = float(met.all(dim=1).double().mean())
    return out
