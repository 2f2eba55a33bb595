"""The paper's figures, in its layouts, from a bench's committed results.

    python benchmarks/figures.py text_paper --root benchmarks/results/text_paper     # Figures 1, 4, 5
    python benchmarks/figures.py video_paper --root benchmarks/results/video_paper   # Figure 2 (+ cross-video)
    python benchmarks/figures.py video_depth --root benchmarks/results/video_depth   # Figure 3
    python benchmarks/figures.py video_depth_noisy --root benchmarks/results/video_depth_noisy   # Figure 3 at 0.13
    python benchmarks/figures.py video_deep --root benchmarks/results/video_deep     # Figure 2 at depth (+ band)
    python benchmarks/figures.py video_paper --root benchmarks/results/video_paper_saltpepper   # the same, salt-and-pepper
    python benchmarks/figures.py video_deep --root benchmarks/results/video_deep_saltpepper     # the same, salt-and-pepper
    python benchmarks/figures.py lista_map --root benchmarks/results/lista_map       # where per-level descent pays

Each writes PNGs into ``--root`` (or ``--out``) and prints their names. Constrained runs are drawn
solid, the others dashed, as in the paper; bands and error bars are the std over seeds, and none
is drawn for one seed.

- Figure 1: test loss per layer (in distribution) beside the metric against gamma, per regime.
- Figure 4: the metric against gamma, one panel per evaluation set (the test split and each domain).
- Figure 5: the alpha sweep: per-layer validation loss of the tested epoch beside the metric
  against gamma, one line per alpha.
- Figure 2: RMSE against gamma, rows architectures, columns videos: the runs trained at one
  noise level, tested on the test split (validation-tuning runs and band-trained forms apart).
  ``figure2_band.png``: the forms trained on a band of levels, rows architectures, columns the
  test split and each unseen video.
- Figure 3: RMSE against depth at the larger gammas, one line per solver.
- ``lista_map.png`` (benchmarks/lista_map.toml): the map's judged cells as a heat map, band top x test
  gamma over the band's top, coloured by levels' difference from the stronger baseline in % of its
  mean (> 0 favours levels; ▲ better, ▼ worse at the family's Holm level); beside it the multipliers
  at the band's top level per transition, and the per-layer test loss at 4 x the band's top.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

from layerdescent.analysis.judging import judge
from layerdescent.analysis.plots import save_png
from layerdescent.analysis.report import collect, domain_results, summarize
from layerdescent.bench.plan import bench_spec

CONSTRAINED = "primal-dual"
STYLE = {"erm": "--", "penalty": ":"}


def matplotlib_colors():
    import matplotlib.colors

    return matplotlib.colors


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _line(ax, x, mean, std, label, solver, n) -> None:
    """One series: solid when constrained, with its seed spread unless it has one seed."""
    x, mean, std = np.asarray(x, dtype=float), np.asarray(mean, dtype=float), np.asarray(std, dtype=float)
    line = ax.plot(x, mean, linestyle="-" if solver == CONSTRAINED else STYLE.get(solver, "--"), marker="o", markersize=3, label=label)[0]
    if n > 1:
        ax.fill_between(x, mean - std, mean + std, alpha=0.15, color=line.get_color())


def _metric_vs_gamma(ax, groups: dict, labels: list[str], metric: str) -> None:
    for label in labels:
        grp = groups[label]
        points = [(g, s["metrics"][metric]) for g, s in sorted(grp["gammas"].items()) if metric in s["metrics"]]
        _line(ax, [g for g, _ in points], [m["mean"] for _, m in points], [m["std"] for _, m in points], label, grp["solver"], grp["n"])
    ax.set(xlabel="γ", ylabel=metric)


def _integer_ticks(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig, out: Path, name: str) -> str:
    for ax in fig.axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small", loc="best")
    fig.tight_layout()
    save_png(fig, out / name, bbox=None)
    _plt().close(fig)
    return name


def regimes(groups: dict) -> dict[str, list[str]]:
    """Labels by training regime: the ``train_gamma=X`` part of their name ('' when none has one)."""
    found: dict[str, list[str]] = {}
    shared = []
    for label in groups:
        match = re.search(r"train_gamma=([0-9.]+)", label)
        if match:
            found.setdefault(match.group(1), []).append(label)
        else:
            shared.append(label)
    # A variant that names no regime (erm trained clean) is a baseline for every regime, not a regime of its own.
    return {regime: labels + shared for regime, labels in found.items()} if found else {"": shared}


def main_labels(labels: list[str]) -> list[str]:
    """The main comparison of a regime: its erm, penalty, primal-dual and live variants, no sweeps."""
    return [label for label in labels if label.split(",")[0] in ("erm", "penalty", "primal-dual", "live", "erm-clean")]


def figure_1(groups: dict, metric: str, out: Path) -> list[str]:
    """Per regime: the test loss at every layer (gamma 0) beside the metric against gamma."""
    plt, names = _plt(), []
    for regime, labels in regimes(groups).items():
        labels = main_labels(labels) or labels
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for label in labels:
            grp = groups[label]
            stats = grp["gammas"][min(grp["gammas"])]["layer_loss"]
            _line(left, range(len(stats["mean"])), stats["mean"], stats["std"], label, grp["solver"], grp["n"])
        left.set(xlabel="layer", ylabel="test loss", title=f"loss per layer, γ=0{f' (trained at γ={regime})' if regime else ''}")
        _integer_ticks(left)
        _metric_vs_gamma(right, groups, labels, metric)
        right.set(title=f"{metric} against γ")
        names.append(_save(fig, out, f"figure1{'_train_gamma=' + regime if regime else ''}.png"))
    return names


def figure_4(groups: dict, domains: dict[str, dict], metric: str, out: Path) -> list[str]:
    """The metric against gamma, a panel per evaluation set (test first), a row per regime."""
    plt = _plt()
    panels = {"test": groups, **domains}
    rows = regimes(groups)
    fig, axes = plt.subplots(len(rows), len(panels), figsize=(4.5 * len(panels), 3.5 * len(rows)), squeeze=False)
    for row, (regime, labels) in enumerate(rows.items()):
        labels = main_labels(labels) or labels
        for ax, (where, panel) in zip(axes[row], panels.items()):
            _metric_vs_gamma(ax, panel, [label for label in labels if label in panel], metric)
            ax.set(title=f"{where}{f', trained at γ={regime}' if regime else ''}")
    return [_save(fig, out, "figure4.png")]


def figure_5(groups: dict, results: list[dict], metric: str, out: Path) -> list[str]:
    """The alpha sweep of each regime: per-layer validation loss (tested epoch) beside the metric against gamma."""
    plt, names = _plt(), []
    for regime, labels in regimes(groups).items():
        swept = {}
        for label in labels:
            grp = groups[label]
            if grp["solver"] == CONSTRAINED and grp["config"].get("constraints.0.reference", "detached") == "detached":
                swept.setdefault(grp["config"].get("constraints.0.alpha"), label)
        if len(swept) < 3:
            continue
        ordered = [swept[a] for a in sorted(swept)]
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for label in ordered:
            val = [r["train"]["best_val_loss"] for r in results if r["label"] == label and r["train"].get("best_val_loss")]
            if val:
                _line(
                    left,
                    range(len(val[0])),
                    np.mean(val, axis=0),
                    np.std(val, axis=0, ddof=1) if len(val) > 1 else 0 * np.mean(val, axis=0),
                    f"α={groups[label]['config']['constraints.0.alpha']:g}",
                    CONSTRAINED,
                    len(val),
                )
        left.set(xlabel="layer", ylabel="validation loss", title=f"α sweep{f' (trained at γ={regime})' if regime else ''}")
        _integer_ticks(left)
        _metric_vs_gamma(right, groups, ordered, metric)
        for line, label in zip(right.get_lines(), ordered):
            line.set_label(f"α={groups[label]['config']['constraints.0.alpha']:g}")
        names.append(_save(fig, out, f"figure5{'_train_gamma=' + regime if regime else ''}.png"))
    return names


def _tested(groups: dict, on_band: bool) -> dict:
    """The groups tested on the test split and trained on a band of noise levels (``on_band``) or at one level."""
    return {
        label: g
        for label, g in groups.items()
        if g["split"] == "test" and isinstance(g["config"].get("train.train_gamma"), list) == on_band
    }


def one_level(groups: dict) -> dict:
    """The groups trained at one noise level and tested on the test split: Figure 2's runs."""
    return _tested(groups, on_band=False)


def band(groups: dict) -> dict:
    """The groups trained on a band of noise levels (the shift-robust forms and their baselines)."""
    return _tested(groups, on_band=True)


def figure_2_band(views: dict[str, dict], metric: str, out: Path) -> list[str]:
    """The band-trained forms against gamma: rows architectures, columns the evaluation sets (``views``: name -> groups)."""
    plt = _plt()
    archs = sorted({g["config"].get("task.arch") for view in views.values() for g in view.values()})
    fig, axes = plt.subplots(len(archs), len(views), figsize=(4.5 * len(views), 3.3 * len(archs)), squeeze=False)
    for i, arch in enumerate(archs):
        for j, (name, view) in enumerate(views.items()):
            _metric_vs_gamma(axes[i, j], view, [label for label, g in view.items() if g["config"].get("task.arch") == arch], metric)
            axes[i, j].set(title=f"{arch}, trained on a band: {name}")
    return [_save(fig, out, "figure2_band.png")]


def figure_2(groups: dict, metric: str, out: Path, name: str = "figure2.png") -> list[str]:
    """The metric against gamma, rows architectures, columns videos."""
    plt = _plt()
    archs = sorted({g["config"].get("task.arch") for g in groups.values()})
    videos = list(dict.fromkeys(g["config"].get("task.dataset") for g in groups.values()))
    fig, axes = plt.subplots(len(archs), len(videos), figsize=(4.5 * len(videos), 3.3 * len(archs)), squeeze=False)
    for i, arch in enumerate(archs):
        for j, video in enumerate(videos):
            labels = [
                label for label, g in groups.items() if g["config"].get("task.arch") == arch and g["config"].get("task.dataset") == video
            ]
            _metric_vs_gamma(axes[i, j], groups, labels, metric)
            axes[i, j].set(title=f"{arch} on {video}")
    return [_save(fig, out, name)]


def figure_3(groups: dict, metric: str, out: Path, gammas: int = 2) -> list[str]:
    """The metric against depth at the ``gammas`` largest noise levels, one line per solver."""
    plt = _plt()
    levels = sorted({g for grp in groups.values() for g in grp["gammas"]})[-gammas:]
    noise = {grp["config"].get("train.train_gamma", 0.0) for grp in groups.values()}
    trained = "trained clean" if noise == {0.0} else f"trained at γ={noise.pop():g}" if len(noise) == 1 else "trained at several levels"
    fig, axes = plt.subplots(1, len(levels), figsize=(5 * len(levels), 4), squeeze=False)
    for ax, gamma in zip(axes[0], levels):
        for solver in dict.fromkeys(g["solver"] for g in groups.values()):
            points = sorted(
                (g["config"]["task.layers"], g["gammas"][gamma]["metrics"][metric], g["n"])
                for g in groups.values()
                if g["solver"] == solver and gamma in g["gammas"]
            )
            _line(
                ax,
                [p[0] for p in points],
                [p[1]["mean"] for p in points],
                [p[1]["std"] for p in points],
                solver,
                solver,
                min(p[2] for p in points),
            )
        ax.set(xlabel="depth (layers)", ylabel=metric, title=f"{metric} at γ={gamma:g} ({trained})")
        _integer_ticks(ax)
    return [_save(fig, out, "figure3.png")]


def band_top(group: dict) -> float:
    """The top level of the band a group trained on."""
    band = group["config"]["train.train_gamma"]
    return float(band[-1] if isinstance(band, list) else band)


def _multipliers_at(run: dict, level: float) -> list[float]:
    """One run's multiplier per transition l_k <= l_(k-1) held at ``level`` (the labels' "@level")."""
    table = run["constraints"]["descent"]
    return [lam for name, lam in zip(table["labels"], table["lambda"]) if float(name.rsplit("@", 1)[1]) == level]


def lista_map(results: list[dict], spec, out: Path) -> list[str]:
    """The map family's cells as a heat map (band top x multiple of it), the multipliers at the band's top, the per-layer loss at 4x."""
    plt, groups = _plt(), summarize(results)
    endpoints = spec.endpoints()
    cells = [c for c, e in zip(judge(results, spec, endpoints), endpoints) if e.family == "map" and c.get("difference")]
    tops = sorted({band_top(groups[c["variant"]]) for c in cells})
    multiples = sorted({round(c["gamma"] / band_top(groups[c["variant"]]), 6) for c in cells})
    relative = np.full((len(tops), len(multiples)), np.nan)
    fig, (heat, lam, loss) = plt.subplots(1, 3, figsize=(15, 4.2))
    for c in cells:
        top = band_top(groups[c["variant"]])
        i, j = tops.index(top), multiples.index(round(c["gamma"] / top, 6))
        relative[i, j] = 100 * c["difference"]["mean"] / abs(float(np.mean(c["b"])))
        mark = {"better": " ▲", "worse": " ▼"}.get(c["verdict"], "")
        color = "white" if abs(relative[i, j]) > 50 else "black"
        heat.text(j, i, f"{relative[i, j]:+.1f}%{mark}", ha="center", va="center", fontsize="small", color=color)
    bound = float(np.nanmax(np.abs(relative))) if cells else 1.0
    # symmetric-log colours: a few percent stay visible beside a several-fold break
    norm = matplotlib_colors().SymLogNorm(linthresh=5.0, vmin=-bound, vmax=bound)
    image = heat.imshow(relative, cmap="RdBu", norm=norm, aspect="auto")
    fig.colorbar(image, ax=heat, label="Δ, % of the stronger baseline (> 0: levels better)")
    heat.set(
        xticks=range(len(multiples)),
        xticklabels=[f"{m:g}×" for m in multiples],
        yticks=range(len(tops)),
        yticklabels=[f"{t:g}" for t in tops],
        xlabel="test γ ÷ the band's top",
        ylabel="band top (trained on [0, top/2, top])",
        title="last-layer test MSE (Holm over the map)",
    )
    for n, top in enumerate(tops):
        color = ("black", "tab:orange", "tab:purple")[n % 3]  # one colour a band (kept apart by the PNG palette), one line style an arm
        levels = [label for label, g in groups.items() if band_top(g) == top and g["solver"] == CONSTRAINED]
        runs = [r for r in results if r["label"] in levels and "descent" in r.get("constraints", {})]
        if runs:
            per_run = np.array([_multipliers_at(r, top) for r in runs])
            config = groups[levels[0]]["config"]
            tuned = f"α {config.get('constraints.0.alpha', '?')}, dual_lr {config.get('solver.dual_lr', '?'):g}"
            lam.plot(
                range(1, per_run.shape[1] + 1),
                per_run.mean(axis=0),
                marker="o",
                markersize=3,
                color=color,
                label=f"band top {top:g} ({tuned})",
            )
        for label in [label for label, g in groups.items() if band_top(g) == top]:
            record = groups[label]["gammas"].get(4 * top)
            if record is not None:
                mean = np.asarray(record["layer_loss"]["mean"])
                style = "-" if groups[label]["solver"] == CONSTRAINED else STYLE.get(groups[label]["solver"], "--")
                loss.plot(range(len(mean)), mean / mean[0], linestyle=style, marker="o", markersize=2, color=color, label=label)
    lam.set(xlabel="transition k (l_k ≤ l_(k−1))", ylabel="λ at the end, mean over seeds", title="multipliers at the band's top level")
    lam.set_yscale("symlog", linthresh=0.1)
    loss.set(xlabel="layer", ylabel="test loss ÷ layer 0's", title="per-layer test loss at 4 × the band's top", yscale="log")
    _integer_ticks(lam)
    _integer_ticks(loss)
    return [_save(fig, out, "lista_map.png")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "bench", choices=("text_paper", "text_deep", "video_paper", "video_deep", "video_depth", "video_depth_noisy", "lista_map")
    )
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or args.root
    out.mkdir(parents=True, exist_ok=True)
    results = collect(args.root)
    groups = summarize(results)
    domains = {name: summarize(view) for name, view in domain_results(results).items()}
    if args.bench == "lista_map":
        names = lista_map(results, bench_spec(Path(__file__).parent / "lista_map.toml"), out)
    elif args.bench.startswith("text"):
        names = figure_1(groups, "accuracy", out) + figure_4(groups, domains, "accuracy", out) + figure_5(groups, results, "accuracy", out)
    elif args.bench in ("video_paper", "video_deep"):
        names = figure_2(one_level(groups), "rmse", out) + [
            n for name, d in domains.items() for n in figure_2(one_level(d), "rmse", out, f"figure2_domain={name}.png")
        ]
        views = {name: view for name, view in {"test": band(groups), **{name: band(d) for name, d in domains.items()}}.items() if view}
        if "test" in views:
            names += figure_2_band(views, "rmse", out)
    else:
        names = figure_3(groups, "rmse", out)
    print("\n".join(names))


if __name__ == "__main__":
    main()
