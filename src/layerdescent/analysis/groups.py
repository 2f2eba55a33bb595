"""Runs grouped by variant and context: who is compared with whom, and which settings were swept.

Runs are grouped by ``label`` (one variant, several seeds). Groups with the same task and
evaluation settings (their ``config.toml`` less how they were trained: solver, constraints,
train, seed and label) share a context: within it, the baseline solver's group (the one labelled
by that solver's name, else the nearest) is the baseline for the cost ratio and for paired differences
over seeds, so the baseline's other variants (clean training, dropout) are compared with it too; groups of
solvers that enforce the constraints are also compared with the reference solver's (deep supervision)
and with every solver a bench names in ``[bench] baselines``. Labels alike but for one numeric
config key (evaluation settings aside), with three or more values, form an ablation.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np

from layerdescent.analysis.stats import seed_stats
from layerdescent.options import flat_keys
from layerdescent.registry import get_registry
from layerdescent.run.layout import EXECUTION_KEYS

# How a model was trained, as opposed to what it is and what it is tested on (its context).
TRAINING_CHOICES = ("solver", "constraints", "train", "seed", "label")


def role(solver: str, attr: str) -> bool:
    """A solver's role in the report (``baseline``, ``reference``, ``enforces_constraints``); False for one no plugin registers now."""

    return bool(getattr(get_registry().solvers.get(solver), attr, False))


def _baseline_name() -> str:

    return next((name for name, cls in sorted(get_registry().solvers.items()) if cls.baseline), "baseline")


def context_titles(groups: dict) -> dict[str, str]:
    """A short name per context: the settings that differ between contexts, e.g. 'dataset=bikes, arch=dust'."""
    contexts = {g["context_key"]: g["context"] for g in groups.values()}
    flat = {key: _flat(ctx) for key, ctx in contexts.items()}
    keys = dict.fromkeys(k for f in flat.values() for k in f)
    varying = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True) for f in flat.values()}) > 1]
    return {key: ", ".join(f"{k.rsplit('.', 1)[-1]}={f.get(k)}" for k in varying) for key, f in flat.items()}


def _flat(table: dict, prefix: str = "") -> dict:
    """Dotted keys for nested tables; a list of tables (constraints) is numbered: constraints.0.alpha."""
    out = {}
    for k, v in table.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            v = {str(i): x for i, x in enumerate(v)}
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _nearest(groups: dict, label: str, candidates: list[str]) -> str | None:
    """Of ``candidates``, the group trained most like ``label``, on a tie the one labelled by its solver's name.

    "Most like it" counts the config keys (solver, constraints and seed aside) that differ, so a
    bench over training regimes (say ``train.train_gamma``) pairs each run with its own regime.
    """
    config = groups[label]["config"]

    def distance(other: str) -> tuple[int, bool]:
        theirs = groups[other]["config"]
        keys = {k for k in {*config, *theirs} if not k.startswith(("solver.", "constraints.", "seed", "label"))}
        return sum(config.get(k) != theirs.get(k) for k in keys), other != groups[other]["solver"]

    return min(candidates, key=distance, default=None)


def _in_context(groups: dict, label: str, attr: str) -> list[str]:
    """The groups in ``label``'s context whose solver has role ``attr``."""
    key = groups[label]["context_key"]
    return [other for other, g in groups.items() if role(g["solver"], attr) and g["context_key"] == key]


def _baseline(groups: dict, label: str) -> str | None:
    """The baseline group ``label`` is compared with: of its context's baseline groups labelled by the solver's name (or "name,..." in a grid), else of all of them, the nearest."""
    candidates = _in_context(groups, label, "baseline")
    main = [c for c in candidates if c.split(",")[0] == groups[c]["solver"]]
    return _nearest(groups, label, main or candidates)


def comparisons(groups: dict, baselines: tuple[str, ...] | list[str] = ()) -> list[tuple[str, str]]:
    """(label, reference) pairs in one context: everything against its baseline, constrained groups against the
    reference solver's (deep supervision), and constrained groups against the nearest group of every solver in ``baselines``."""
    pairs = [(label, ref) for label in groups if (ref := _baseline(groups, label)) not in (None, label)]
    for label, g in groups.items():
        if not role(g["solver"], "enforces_constraints"):
            continue
        refs = [_nearest(groups, label, _in_context(groups, label, "reference"))]
        refs += [baseline_group(groups, label, solver) for solver in baselines]
        pairs += [(label, ref) for ref in dict.fromkeys(refs) if ref is not None and (label, ref) not in pairs]
    return pairs


def baseline_group(groups: dict, label: str, solver: str) -> str | None:
    """The group of ``solver`` that ``label`` is judged against: in its context, labelled by the solver's name if one is, the nearest."""
    key = groups[label]["context_key"]
    candidates = [
        other for other, g in groups.items() if g["solver"] == solver and g["context_key"] == key and g["split"] == groups[label]["split"]
    ]
    main = [c for c in candidates if c.split(",")[0] == solver]
    return _nearest(groups, label, main or candidates)


def ablated_keys(groups: dict) -> dict[str, str]:
    """The numeric config keys some groups differ in alone (seed, label and evaluation aside): key -> its short name."""
    keys = dict.fromkeys(
        k
        for grp in groups.values()
        for k, v in grp["config"].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("seed", "label") and not k.startswith("eval.")
    )
    short = {k: k.rsplit(".", 1)[-1] for k in keys}
    clashing = {name for name in short.values() if list(short.values()).count(name) > 1}
    return {k: k if name in clashing else name for k, name in short.items()}


def ablations(groups: dict) -> dict[str, list[list[str]]]:
    """Per ablated key (``ablated_keys``), its series: labels alike but for that key (seed and evaluation aside), 3+ values, by value."""
    found = {}
    for key in ablated_keys(groups):
        series: dict[str, list[str]] = {}
        for label, grp in groups.items():
            if isinstance(grp["config"].get(key), (int, float)):
                # the evaluation grid may differ within a series, the split (test or validation) may not
                rest = {
                    k: v
                    for k, v in grp["config"].items()
                    if k not in (key, "label", "seed") and (k == "eval.split" or not k.startswith("eval."))
                }
                series.setdefault(json.dumps(rest, sort_keys=True, default=str), []).append(label)
        swept = [sorted(labels, key=lambda label: groups[label]["config"][key]) for labels in series.values()]
        swept = [labels for labels in swept if len({groups[label]["config"][key] for label in labels}) >= 3]
        if swept:
            found[key] = swept
    return found


def _shared_gammas(groups: dict, labels: list[str]) -> list[float]:
    """The gammas every one of ``labels`` was evaluated at."""
    return sorted(set.intersection(*(set(groups[label]["gammas"]) for label in labels)))


def _summarize_group(runs: list[dict]) -> dict:
    """Aggregate the seeds of one label."""
    by_gamma: dict[float, list[dict]] = {}
    for run in runs:
        for g in run["gammas"]:
            by_gamma.setdefault(float(g["gamma"]), []).append(g)
    gammas = {}
    for gamma in sorted(by_gamma):
        rows = by_gamma[gamma]
        gammas[gamma] = {
            # a metric some seeds lack (a damaged or older run) is summarized over the seeds that have it
            "metrics": {
                m: seed_stats([r["metrics"][m] for r in rows if m in r["metrics"]])
                for m in dict.fromkeys(m for r in rows for m in r["metrics"])
            },
            "layer_loss": seed_stats([r["layer_loss"] for r in rows]),
            "descent_rate": seed_stats([r["descent_rate"] for r in rows]),
            # each metric at every layer, where the task reads one per layer (and every seed has it)
            "layer_metrics": {
                m: seed_stats([r["layer_metrics"][m] for r in rows])
                for m in rows[0].get("layer_metrics", {})
                if all(m in r.get("layer_metrics", {}) for r in rows)
            },
        }
    times = [r["train"].get("step_time_median") for r in runs]
    times = [t for t in times if t is not None]
    lambdas = {}
    for name, c in runs[0].get("constraints", {}).items():
        per_seed = [r["constraints"][name]["lambda"] for r in runs if name in r.get("constraints", {})]
        # binding: entries whose multiplier ended positive, summed over seeds (of entries x seeds)
        lambdas[name] = {
            "labels": c.get("labels", []),
            "mean": np.mean(per_seed, axis=0).tolist(),
            "binding": int((np.asarray(per_seed) > 0).sum()),
            "entries": int(np.asarray(per_seed).size),
        }
        rows = [r["constraints"][name]["per_sample"] for r in runs if "per_sample" in r.get("constraints", {}).get(name, {})]
        if rows:  # a per-sample constraint: its lambdas are means over rows; what binds and what is met is per row
            lambdas[name]["per_sample"] = {
                key: float(np.mean([row[key] for row in rows]))
                for key in ("binding_rows", "satisfied_rows")
                if all(row.get(key) is not None for row in rows)
            }
    return {
        "solver": runs[0]["solver"],
        "task": runs[0]["task"],
        "perturbation": runs[0].get("perturbation"),
        "split": runs[0].get("split", "test"),
        "n": len(runs),
        "seeds": [r["seed"] for r in runs],
        "run_dirs": [r["run_dir"] for r in runs if "run_dir" in r],
        "num_layers": runs[0]["num_layers"],
        "context": runs[0].get("context", {}),
        "context_key": json.dumps(runs[0].get("context", {}), sort_keys=True),
        "config": _flat(runs[0].get("config", {})),
        "gammas": gammas,
        "lambda": lambdas,
        "step_time": float(np.mean(times)) if times else None,
    }


def domain_results(results: list[dict]) -> dict[str, list[dict]]:
    """Per evaluation domain (``eval.domains``), each run's results with that domain's records as its ``gammas``."""
    views: dict[str, list[dict]] = {}
    for r in results:
        for name, records in r.get("domains", {}).items():
            views.setdefault(name, []).append({**r, "gammas": records})
    return views


MEAN_SPLIT = re.compile(r"mean\((.+)\)")  # an evaluation set that is the mean over several domains: "mean(carphone, bikes)"


def mean_domains(split: str) -> tuple[str, ...] | None:
    """The domains a ``mean(a, b)`` split averages over, or None for a plain split."""
    match = MEAN_SPLIT.fullmatch(split.strip())
    return tuple(name.strip() for name in match.group(1).split(",")) if match else None


def domain_mean_results(results: list[dict], domains: tuple[str, ...]) -> list[dict]:
    """Each run that was evaluated on every one of ``domains``, with the mean over them of each gamma's numbers as its ``gammas``.

    Per run first, then paired across runs: a run's value is the mean of its own domain values, at
    the gammas every one of the domains has.
    """
    out = []
    for r in results:
        tables = [r.get("domains", {}).get(name) for name in domains]
        if any(not t for t in tables):
            continue
        common = sorted(set.intersection(*({float(record["gamma"]) for record in table} for table in tables)))
        records = []
        for gamma in common:
            at_gamma = [next(record for record in table if float(record["gamma"]) == gamma) for table in tables]
            record = {"gamma": at_gamma[0]["gamma"]}
            for key in ("layer_loss", "descent_rate"):
                record[key] = [sum(values) / len(values) for values in zip(*(rec[key] for rec in at_gamma))]
            names = set.intersection(*(set(rec.get("metrics", {})) for rec in at_gamma))
            record["metrics"] = {m: sum(rec["metrics"][m] for rec in at_gamma) / len(at_gamma) for m in sorted(names)}
            records.append(record)
        out.append({**r, "gammas": records})
    return out


KEPT_EPOCH = "validation (kept epoch)"  # the evaluation set early stopping chose the tested epoch by


def kept_epoch_results(results: list[dict]) -> list[dict]:
    """Each run early stopping kept an epoch of, its ``gammas`` that epoch's validation: the per-layer loss at ``train.validation_gamma``, metric "loss" the last layer's."""
    out = []
    for r in results:
        loss = r.get("train", {}).get("best_val_loss")
        gamma = r.get("config", {}).get("train", {}).get("validation_gamma")
        if loss and gamma is not None:
            unknown = [math.nan] * (len(loss) - 1)  # training's validation records no per-sample descent
            record = {"gamma": gamma, "layer_loss": list(loss), "descent_rate": unknown, "metrics": {"loss": loss[-1]}}
            out.append({**r, "gammas": [record], "domains": {}})
    return out


def split_mixed_labels(results: list[dict]) -> None:
    """Give runs that share a label but not a config (seed and execution keys aside) one label per config, named by the keys that differ.

    Two configs under one label are two groups, ``primal-dual [solver.dual_lr=0.5]`` and
    ``primal-dual [solver.dual_lr=1]``, never one spread shown as a spread over seeds.
    """
    by_label: dict[str, list[dict]] = {}
    for r in results:
        by_label.setdefault(r["label"], []).append(r)
    for label, runs in by_label.items():
        prints = [_fingerprint(r.get("config", {})) for r in runs]
        if len({repr(sorted(p.items())) for p in prints}) < 2:
            continue
        keys = sorted(k for k in set().union(*prints) if len({repr(p.get(k)) for p in prints}) > 1)
        for r, p in zip(runs, prints):
            r["label"] = f"{label} [{', '.join(f'{k}={_short(p.get(k))}' for k in keys)}]"


def _fingerprint(config: dict) -> dict:
    """A run's config as dotted keys, less what does not make it another run (its seed, label and execution keys)."""
    return {k: v for k, v in flat_keys(config).items() if k not in ("seed", "label") and k not in EXECUTION_KEYS}


def _short(value) -> str:
    return f"{value:g}" if isinstance(value, float) else "unset" if value is None else str(value)


def summarize(results: list[dict]) -> dict:
    """Group runs by label (first-seen order) and reduce each group over its seeds."""
    runs_by_label: dict[str, list[dict]] = {}
    for r in results:
        runs_by_label.setdefault(r["label"], []).append(r)
    groups = {label: _summarize_group(runs) for label, runs in runs_by_label.items()}
    for label, g in groups.items():
        base = _baseline(groups, label)
        base_time = groups[base]["step_time"] if base else None
        g["step_time_ratio"] = g["step_time"] / base_time if g["step_time"] is not None and base_time else None
    return groups


def _all_gammas(groups: dict) -> list[float]:
    return sorted({g for grp in groups.values() for g in grp["gammas"]})


def metric_names(groups: dict) -> list[str]:
    """Every metric any group reports, in first-seen order; a task may report none."""
    return list(dict.fromkeys(m for grp in groups.values() for s in grp["gammas"].values() for m in s["metrics"]))


def legend_name(label: str, grp: dict) -> str:
    """A label as plots show it: runs evaluated on another split than test say which."""
    return label if grp["split"] == "test" else f"{label} ({grp['split']})"
