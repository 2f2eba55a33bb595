"""The summary's plots: loss per layer, metric against gamma, descent rate, multiplier traces, ablations, the trade-off."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from layerdescent.analysis.groups import (
    _all_gammas,
    _shared_gammas,
    ablated_keys,
    ablations,
    context_titles,
    legend_name,
    metric_names,
    role,
)
from layerdescent.errors import LayerdescentError
from layerdescent.readback import read_jsonl
from layerdescent.registry import get_registry


def read_log(path: Path) -> list[dict]:
    """The records of one metrics.jsonl, or of its gzipped copy (``metrics.jsonl.gz``, as a committed bench keeps it); LayerdescentError naming the file and line if one is damaged."""
    return read_jsonl(path, fix="the log is damaged: delete it, or run that run again")


def run_log(run_dir: Path) -> Path | None:
    """A run's log: ``metrics.jsonl``, or ``metrics.jsonl.gz`` where a committed bench keeps it compressed; None where it has none."""
    for name in ("metrics.jsonl", "metrics.jsonl.gz"):
        if os.path.lexists(Path(run_dir) / name):
            return Path(run_dir) / name
    return None


def _traces(groups: dict) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(steps, lambda, violation), each [step, entry], per (label, constraint) from the first seed of each constrained label."""
    traces = {}
    for label, grp in groups.items():
        log = run_log(grp["run_dirs"][0]) if grp["run_dirs"] else None
        if not role(grp["solver"], "enforces_constraints") or log is None:
            continue
        records = [r for r in read_log(log) if r.get("event") == "train" and isinstance(r.get("lambda"), dict) and "step" in r]
        for name in records[0]["lambda"] if records else []:
            try:
                steps = np.array([r["step"] for r in records], dtype=float)
                lam = np.array([r["lambda"][name] for r in records], dtype=float).reshape(len(records), -1)
                violation = np.array([r.get("violation", {}).get(name, [np.nan] * lam.shape[1]) for r in records], dtype=float).reshape(
                    lam.shape
                )
            except (KeyError, TypeError, ValueError):
                raise LayerdescentError(
                    f"{log}: the multipliers of constraint {name!r} change shape or go missing between lines; the log is damaged"
                ) from None
            traces[label, name] = (steps, lam, violation)
    return traces


def describe_runs(groups: dict) -> tuple[str, str]:
    """A plot title naming the task(s) and dataset(s), and an axis label saying what gamma is.

    What gamma means comes from the task's ``perturbation_titles`` (registered plugins only), e.g.
    "γ: Gaussian embedding noise, std = γ × RMS of the word embeddings"; otherwise its name.
    """

    tasks = {}  # task -> datasets, perturbations
    for grp in groups.values():
        task = grp["config"].get("task.name") or grp.get("task", "")
        datasets, perturbations = tasks.setdefault(task, ({}, {}))
        if grp["config"].get("task.dataset") is not None:
            datasets[str(grp["config"]["task.dataset"])] = None
        perturbations[grp.get("perturbation") or grp["config"].get("task.perturbation") or ""] = None
    title = "; ".join(f"{task} on {', '.join(datasets)}" if datasets else task for task, (datasets, _) in tasks.items() if task)
    meanings = []
    for task, (_, perturbations) in tasks.items():
        cls = get_registry().tasks.get(task)
        for name in perturbations:
            meaning = getattr(cls, "perturbation_titles", {}).get(name) if cls else None
            meanings.append(meaning or (f"{name} perturbation level" if name else "perturbation level"))
    return title, "γ: " + "; ".join(dict.fromkeys(meanings))


def _readable_log_axis(ax) -> None:
    """A log y axis whose ticks read as plain numbers (0.2, 0.5, 1), minor ones labelled when few decades show."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_yscale("log", nonpositive="clip")
    low, high = ax.get_ylim()
    plain = FuncFormatter(lambda v, _: f"{v:.3g}")
    ax.yaxis.set_major_formatter(plain)
    if high / low < 1e3:  # few decades: label 2 and 5 within each, or the axis shows one number or none
        ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
        ax.yaxis.set_minor_formatter(plain)


def _series(ax, x, stats: dict, label: str, constrained: bool, color: str, band: bool = False) -> None:
    """One line of means in ``color``; error bars (or a band) of one std only when there is more than one seed."""
    mean, std = np.asarray(stats["mean"], dtype=float), np.asarray(stats["std"], dtype=float)
    style = "-" if constrained else "--"
    spread = stats.get("n", 2) > 1
    if band or not spread:
        ax.plot(x, mean, linestyle=style, marker="o", label=label, color=color)
        if band and spread:
            ax.fill_between(x, mean - std, mean + std, alpha=0.2, color=color)
    else:
        ax.errorbar(x, mean, yerr=std, linestyle=style, marker="o", capsize=3, label=label, color=color)


def _point_stats(points: list[dict]) -> dict:
    """The per-point stats of one series as one stats table."""
    return {"mean": [p["mean"] for p in points], "std": [p["std"] for p in points], "n": min((p.get("n", 2) for p in points), default=1)}


def _finish(fig, axes, path: Path, title: str = "", note: str = "") -> None:
    """One legend below the panels (never on the data), the title above, saved at ``path``."""
    handles = {}
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.tight_layout()
    if title or note:
        fig.suptitle("\n".join(t for t in (title, note) if t), y=1.0, va="bottom", fontsize="medium")
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=min(len(handles), 4),
            fontsize="small",
            frameon=False,
        )
    save_png(fig, path)
    import matplotlib.pyplot as plt

    plt.close(fig)


PNG_DPI = 100
PNG_COLORS = 64  # a plot's few line colours and their anti-aliasing; a palette PNG is about a quarter of an RGB one


def save_png(fig, path: Path, bbox: str | None = "tight") -> None:
    """Write ``fig`` at ``path`` as a small PNG: rendered at ``PNG_DPI``, then reduced to a ``PNG_COLORS``-colour palette (the same bytes every time)."""
    from PIL import Image

    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=PNG_DPI, bbox_inches=bbox)
    image = Image.open(io.BytesIO(rendered.getvalue())).convert("RGB").quantize(colors=PNG_COLORS, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    Path(path).write_bytes(out.getvalue())


def _metric_panel(ax, groups: dict, context_key: str, metric: str, colors: dict[str, str]) -> None:
    """``metric`` against gamma for every label of one context, solid constrained, dashed the rest."""
    for label, grp in groups.items():
        if grp["context_key"] != context_key:
            continue
        pts = [(g, st["metrics"][metric]) for g, st in grp["gammas"].items() if metric in st["metrics"]]
        if pts:
            _series(
                ax,
                [g for g, _ in pts],
                _point_stats([m for _, m in pts]),
                legend_name(label, grp),
                role(grp["solver"], "enforces_constraints"),
                colors.get(label, "C0"),
            )


def plot(groups: dict, out: Path, domains: dict[str, dict] | None = None, spec=None, results: list[dict] | None = None) -> list[str]:
    """Write the PNGs and return their file names; ``domains`` maps each evaluation domain to its groups, ``spec`` names the primary metric."""
    import matplotlib

    matplotlib.use("Agg")  # here, not at import, so importing the module leaves a user's backend alone
    import matplotlib.pyplot as plt

    title, gamma_label = describe_runs(groups)
    colors = {label: f"C{i % 10}" for i, label in enumerate(groups)}  # one colour per label in every panel
    solid = "solid: constraints enforced; dashed: the rest"
    gammas = _all_gammas(groups)
    # Figure 1's layout in distribution, at the primary endpoint's shifted gammas and at the largest
    claim = spec.claim() if spec is not None else None
    shifted = [g for g in (claim.gammas if claim else ()) if g in gammas and g != gammas[0]]
    ends = list(dict.fromkeys([gammas[0], *sorted(shifted), gammas[-1]]))
    # a run evaluated on validation (a tuning run) is named so in the legend, the axis says so
    loss_label = "test loss" if all(grp["split"] == "test" for grp in groups.values()) else "loss (test unless the legend names a split)"
    fig, axes = plt.subplots(1, len(ends), figsize=(5 * len(ends), 4), squeeze=False)
    for ax, gamma in zip(axes[0], ends):
        means = []
        for label, grp in groups.items():
            if gamma not in grp["gammas"]:
                continue
            s = grp["gammas"][gamma]["layer_loss"]
            _series(
                ax,
                np.arange(len(s["mean"])),
                s,
                legend_name(label, grp),
                role(grp["solver"], "enforces_constraints"),
                colors[label],
                band=True,
            )
            means.extend(s["mean"])
        if means and min(means) > 0:
            _readable_log_axis(ax)
        kind = "in distribution" if gamma == gammas[0] else "shifted"
        ax.set(title=f"{kind}, γ = {gamma:g}", xlabel="layer (0: the input representation)", ylabel=loss_label)
    _finish(fig, axes, out / "loss_vs_layer.png", title, f"{gamma_label}; {solid}")
    images = ["loss_vs_layer.png"]

    metrics = metric_names(groups)
    titles = context_titles(groups)
    contexts = list(titles)  # one row of panels per context, solid constrained, dashed the rest
    if metrics:
        fig, axes = plt.subplots(len(contexts), len(metrics), figsize=(5 * len(metrics), 4 * len(contexts)), squeeze=False)
        for row, key in enumerate(contexts):
            for ax, metric in zip(axes[row], metrics):
                _metric_panel(ax, groups, key, metric, colors)
                ax.set(title=f"{titles[key]}: {metric}" if titles[key] else metric, xlabel="γ", ylabel=metric)
        _finish(fig, axes, out / "metric_vs_gamma.png", title, f"{gamma_label}; {solid}")
        images.append("metric_vs_gamma.png")

    if domains and metrics:  # a column per evaluation set (the test split first), a row per context and metric
        panels = {"test": groups, **domains}
        rows = [(key, metric) for key in contexts for metric in metrics]
        fig, axes = plt.subplots(len(rows), len(panels), figsize=(4.5 * len(panels), 3.5 * len(rows)), squeeze=False)
        for row, (key, metric) in enumerate(rows):
            for ax, (where, panel) in zip(axes[row], panels.items()):
                _metric_panel(ax, panel, key, metric, colors)
                prefix = f"{titles[key]}, " if titles[key] else ""
                ax.set(title=f"{prefix}{where}: {metric}", xlabel="γ", ylabel=metric)
        _finish(fig, axes, out / "metric_vs_gamma_domains.png", title, f"{gamma_label}; {solid}")
        images.append("metric_vs_gamma_domains.png")

    # The share of test samples each layer improves, in distribution: 1 everywhere is strict descent.
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, grp in groups.items():
        s = grp["gammas"].get(gammas[0], {}).get("descent_rate")
        if s:
            _series(
                ax,
                np.arange(1, len(s["mean"]) + 1),
                s,
                legend_name(label, grp),
                role(grp["solver"], "enforces_constraints"),
                colors.get(label, "C0"),
            )
    ax.set(
        title=f"descent rate in distribution (γ = {gammas[0]:g})",
        xlabel="layer k",
        ylabel="share of samples with l_k < l_(k-1)",
        ylim=(0, 1.02),
    )
    _finish(fig, np.array([ax]), out / "descent_rate.png", title, solid)
    images.append("descent_rate.png")

    traces = _traces(groups)
    if traces:  # one column per constrained label: its multipliers above, its constraint violations below
        fig, axes = plt.subplots(2, len(traces), figsize=(5 * len(traces), 7), squeeze=False)
        for col, ((label, constraint), (steps, lam, violation)) in enumerate(traces.items()):
            entries = groups[label]["lambda"].get(constraint, {}).get("labels") or range(lam.shape[1])
            for j, entry in enumerate(entries):
                axes[0, col].plot(steps, lam[:, j], label=str(entry))
                axes[1, col].plot(steps, violation[:, j], label=str(entry))
            axes[1, col].axhline(0.0, color="black", linewidth=0.8)
            axes[0, col].set(title=f"{label}: {constraint} (first seed)", xlabel="training step", ylabel="multiplier λ")
            axes[1, col].set(xlabel="training step", ylabel="violation (> 0: infeasible)")
        _finish(fig, axes, out / "traces.png", title, "one line per constrained transition")
        images.append("traces.png")

    names = ablated_keys(groups)
    for key, swept in ablations(groups).items() if metrics else ():  # a row per metric, a column per end of the shared gamma grid
        shared = [_shared_gammas(groups, labels) for labels in swept]
        ends = list(dict.fromkeys(g for gammas in shared for g in (gammas[0], gammas[-1])))
        fig, axes = plt.subplots(len(metrics), len(ends), figsize=(5 * len(ends), 3.5 * len(metrics)), squeeze=False)
        for row, metric in enumerate(metrics):
            for ax, gamma in zip(axes[row], ends):
                for labels, gammas in zip(swept, shared):
                    if gamma not in gammas:
                        continue
                    grp = groups[labels[0]]
                    points = [(groups[label]["config"][key], groups[label]["gammas"][gamma]["metrics"].get(metric)) for label in labels]
                    points = [(x, m) for x, m in points if m is not None]
                    if points:
                        _series(
                            ax,
                            [x for x, _ in points],
                            _point_stats([m for _, m in points]),
                            grp["solver"],
                            role(grp["solver"], "enforces_constraints"),
                            colors[labels[0]],
                        )
                ax.set(title=f"{metric} at γ = {gamma:g}", xlabel=names[key], ylabel=metric)
        name = f"ablation_{names[key]}.png"
        _finish(fig, axes, out / name, title, gamma_label)
        images.append(name)
    if metrics and tradeoff(groups, domains or {}, out / "tradeoff.png", spec, title):
        images.append("tradeoff.png")
    return images


def _interval(stats: dict | None) -> tuple[float, float] | None:
    """The mean over seeds and the half-width of its 95% t interval (0 for one seed)."""
    from scipy import stats as st

    if stats is None:
        return None
    n = stats.get("n", 1)
    half = float(st.t.ppf(0.975, n - 1) * stats["std"] / np.sqrt(n)) if n > 1 else 0.0
    return float(stats["mean"]), half


def tradeoff(groups: dict, domains: dict[str, dict], path: Path, spec=None, title: str = "") -> bool:
    """The in-distribution metric against the primary shifted one, a point per variant with 95% t intervals; False if nothing to draw.

    The shifted metric is the primary family's (its metric at its largest gamma, on its first split)
    where the bench pre-registers one, else the first metric at the largest gamma on test. Only the
    variants with the most seeds in their context are drawn.
    """
    import matplotlib.pyplot as plt

    metrics = metric_names(groups)
    primary = spec.claim() if spec is not None else None
    metric = primary.metric if primary and primary.metric in metrics else metrics[0]
    split = primary.splits[0] if primary else "test"
    shifted_groups = groups if split == "test" else domains.get(split, {})
    gammas = _all_gammas(groups)
    shifted = max(primary.gammas) if primary else gammas[-1]
    if shifted == gammas[0] and split == "test":
        return False  # nothing shifted to trade against
    titles = context_titles(groups)
    # a panel per context with runs on test: a context of tuning runs evaluated on validation has no point to draw
    contexts = [key for key in titles if any(g["context_key"] == key and g["split"] == "test" for g in groups.values())]
    if not contexts:
        return False
    cols = min(3, len(contexts))
    rows = -(-len(contexts) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.5 * rows), squeeze=False)
    for ax in axes.ravel()[len(contexts) :]:
        ax.set_visible(False)
    drawn = False
    # a bench of one variant per solver in each context (a grid of datasets) is told apart by solver, else by label
    per_solver = all(
        len([g for g in groups.values() if g["context_key"] == key and g["solver"] == grp["solver"] and g["split"] == "test"]) <= 1
        for key in contexts
        for grp in groups.values()
        if grp["context_key"] == key
    )
    solvers = list(dict.fromkeys(grp["solver"] for grp in groups.values()))
    for ax, key in zip(axes.ravel(), contexts):
        # the variants run at the context's full seed count: a one- or two-seed sweep's t interval would fill the panel
        full = max((g["n"] for g in groups.values() if g["context_key"] == key and g["split"] == "test"), default=0)
        for i, (label, grp) in enumerate(groups.items()):
            if grp["context_key"] != key or grp["split"] != "test" or label not in shifted_groups or grp["n"] < full:
                continue
            x = _interval(grp["gammas"].get(gammas[0], {}).get("metrics", {}).get(metric))
            y = _interval(shifted_groups[label]["gammas"].get(shifted, {}).get("metrics", {}).get(metric))
            if x is None or y is None:
                continue
            constrained = role(grp["solver"], "enforces_constraints")
            name, color = (grp["solver"], f"C{solvers.index(grp['solver']) % 10}") if per_solver else (label, f"C{i % 10}")
            ax.errorbar(x[0], y[0], xerr=x[1], yerr=y[1], fmt="o" if constrained else "s", color=color, capsize=3, label=name)
            drawn = True
        where = "" if split == "test" else f" on {split}"
        ax.set_title(titles[key] or metric, fontsize="small", wrap=True)
        ax.set(xlabel=f"{metric} in distribution (γ = {gammas[0]:g})", ylabel=f"{metric} at γ = {shifted:g}{where}")
    if not drawn:
        plt.close(fig)
        return False
    direction = "" if not primary else f"; {'higher' if primary.higher_is_better else 'lower'} is better on both axes"
    seeds = max((len(grp["seeds"]) for grp in groups.values()), default=0)
    spread = ", 95% t intervals over seeds" if seeds > 1 else ", one seed: no interval"
    _finish(
        fig,
        axes,
        path,
        title,
        f"trade-off: a point per variant (those with the most seeds){spread}{direction}; circles: constraints enforced",
    )
    return True
