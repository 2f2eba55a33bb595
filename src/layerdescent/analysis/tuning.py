"""Tuning the tool runs: a declared search per tuned variant, its trials on validation, and the rule that adopts one.

    [bench.tuning.levels]                       # the main variant "levels" is tuned first
    trials = [                                  # each a set of dotted config keys; or `space`, a grid of them
        { "solver.dual_lr" = 5.0, "constraints.0.alpha" = 0.05 },
        { "solver.dual_lr" = 50.0, "constraints.0.alpha" = 0.05 },
    ]
    criterion = "loss"                          # the last layer's validation loss, a metric the task reports, or
                                                # "best_val_loss" (the kept epoch's last layer, during training)
    gamma = 1.0                                 # read at this validation gamma (best_val_loss: trained with it)
    higher_is_better = false
    qualify = "binds"                           # "binds": only a setting whose multipliers bind at the end; "any"
    seed = 100                                  # the tuning runs' seed (default 100)
    gammas = [0.0, 0.5, 1.0]                    # the tuning runs' validation grid (default [gamma])
    name = "levels"                             # the trials' labels, tune-NAME,... (default: the variant's)
    labels = ["alpha=0.05,lr=5", ...]           # optional: each trial's label after tune-NAME, (default KEY=VALUE,...)
    takes = ["levels-pooled"]                   # optional: other variants trained at the adopted settings too
    tie = 1e-9                                  # criterion values this close are a tie (default 1e-9)

Each trial is a run ``tune-VARIANT,KEY=VALUE,...`` evaluated on the validation split only. Once
every trial has finished or failed, the rule adopts the qualifying trial with the best criterion;
ties (within ``tie``) go to the trial listed first (so list the values in the order you prefer them).
A failed (diverged) trial qualifies for nothing. The adopted settings and every trial are written
to ``OUT/tuning.json`` beside the results (never into the bench file), and the main runs of the
variant (and those it ``takes``) are trained from them; the budget a report states is the number of trials.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerdescent.errors import ConfigError
from layerdescent.results import read_results
from layerdescent.run import rundir
from layerdescent.run.files import write_atomic

ADOPTED = "tuning.json"
TIE = 1e-9  # criterion values this close are a tie, decided by the trials' order
SEARCH_HELP = {
    "trials": "a list of settings, each a table of dotted config keys, in order of preference (or `space`)",
    "space": "a grid: dotted config keys mapped to lists of values, every combination a trial (or `trials`)",
    "criterion": '"loss" (the last layer\'s validation loss), "best_val_loss" (the kept epoch\'s, during training) or a metric the task reports',
    "gamma": "the validation perturbation level the criterion is read at",
    "higher_is_better": "the criterion's direction",
    "qualify": '"any" (default), or "binds": only a setting whose multipliers bind at the end',
    "seed": "the tuning runs' seed (default 100)",
    "gammas": "the tuning runs' validation grid (default [gamma])",
    "name": "the trials' label stem, tune-NAME,... (default: the variant's)",
    "labels": "each trial's label after the stem (default: its KEY=VALUE pairs)",
    "takes": "other variants trained at the adopted settings too",
    "tie": "criterion values this close are a tie, decided by the trials' order (default 1e-9)",
}
SEARCH_KEYS = set(SEARCH_HELP)
BEST_VAL_LOSS = "best_val_loss"  # the criterion read from training: the kept epoch's last-layer validation loss
QUALIFY = ("any", "binds")


@dataclass(frozen=True)
class Search:
    """A declared tuning rule: the settings a variant tries on validation, the criterion that picks one, and what qualifies."""

    variant: str
    trials: tuple[tuple[tuple[str, Any], ...], ...]  # each trial's (dotted key, value) pairs, in preference order
    criterion: str
    gamma: float
    higher_is_better: bool = False
    qualify: str = "any"
    seed: int = 100
    gammas: tuple[float, ...] = ()
    name: str = ""  # the trials' label stem (default: the variant's)
    labels: tuple[str, ...] = ()  # each trial's label after the stem (default: its KEY=VALUE pairs)
    takes: tuple[str, ...] = ()  # other variants trained at the adopted settings
    tie: float = TIE

    def trial_name(self, trial: tuple[tuple[str, Any], ...]) -> str:
        """A trial's run label: ``tune-NAME,alpha=0.05,dual_lr=5``, NAME the variant's unless the search names its own."""
        stem = f"tune-{self.name or self.variant}"
        if self.labels:
            return f"{stem},{self.labels[self.trials.index(trial)]}"
        return ",".join([stem, *(f"{key.rsplit('.', 1)[-1]}={_short(value)}" for key, value in trial)])

    def run_dir(self, out: Path, trial: tuple[tuple[str, Any], ...]) -> Path:
        """Where a trial runs in the bench folder ``out``: ``OUT/tune-NAME,.../seed-SEED``."""
        return Path(out) / self.trial_name(trial) / f"seed-{self.seed}"


def _short(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def parse_search(variant: str, table: Any) -> Search:
    """``[bench.tuning.VARIANT]`` as a Search; ConfigError, one line, for a missing, unknown or mistyped key."""
    where = f"bench.tuning.{variant}"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a number of runs or a table (trials or space, criterion, gamma)")
    unknown = set(table) - SEARCH_KEYS
    if unknown:
        raise ConfigError(f"unknown key {where}.{sorted(unknown)[0]} (allowed: {', '.join(sorted(SEARCH_KEYS))})")
    if ("trials" in table) == ("space" in table):
        raise ConfigError(f"{where} needs trials (a list of settings) or space (a grid of them), one of the two")
    if "trials" in table:
        trials = table["trials"]
        if not isinstance(trials, list) or not trials or not all(isinstance(t, dict) and t for t in trials):
            raise ConfigError(f'{where}.trials must be a non-empty list of settings, e.g. [{{ "solver.dual_lr" = 5.0 }}]')
        chosen = [tuple(t.items()) for t in trials]
    else:
        space = table["space"]
        if not isinstance(space, dict) or not space or not all(isinstance(v, list) and v for v in space.values()):
            raise ConfigError(f'{where}.space must map dotted config keys to non-empty lists, e.g. "solver.dual_lr" = [0.5, 5.0]')
        chosen = [tuple(zip(space, point)) for point in itertools.product(*space.values())]
    for key in ("criterion", "gamma", "higher_is_better"):
        if key not in table:
            raise ConfigError(f"{where} lacks {key!r} (a search needs criterion, gamma and higher_is_better)")
    if not isinstance(table["criterion"], str) or not table["criterion"]:
        raise ConfigError(f'{where}.criterion must be "loss" (the last layer\'s), "{BEST_VAL_LOSS}" or a metric the task reports')
    if not isinstance(table["higher_is_better"], bool):
        raise ConfigError(f"{where}.higher_is_better must be true or false")
    gamma = table["gamma"]
    if not isinstance(gamma, (int, float)) or isinstance(gamma, bool) or not gamma >= 0:
        raise ConfigError(f"{where}.gamma must be one perturbation level >= 0, got {gamma!r}")
    qualify = table.get("qualify", "any")
    if qualify not in QUALIFY:
        raise ConfigError(f"{where}.qualify must be one of {', '.join(QUALIFY)}, got {qualify!r}")
    seed = table.get("seed", 100)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"{where}.seed must be an integer, got {seed!r}")
    gammas = table.get("gammas", [gamma])
    if not isinstance(gammas, list) or float(gamma) not in [float(g) for g in gammas if isinstance(g, (int, float))]:
        raise ConfigError(f"{where}.gammas must be a list of validation gammas that holds gamma ({gamma:g})")
    name = table.get("name", "")
    if not isinstance(name, str) or "/" in name or "\\" in name:
        raise ConfigError(f"{where}.name must be a plain name for its trials' labels (tune-NAME,...), got {name!r}")
    labels = table.get("labels", [])
    if (
        not isinstance(labels, list)
        or not all(isinstance(x, str) and x and "/" not in x for x in labels)
        or len(labels) not in (0, len(chosen))
    ):
        raise ConfigError(f"{where}.labels must name each of its {len(chosen)} trials (plain names, in the trials' order), got {labels!r}")
    takes = table.get("takes", [])
    if not isinstance(takes, list) or not all(isinstance(x, str) and x for x in takes) or variant in takes:
        raise ConfigError(f'{where}.takes must list other variants trained at the adopted settings, e.g. ["levels-pooled"], got {takes!r}')
    tie = table.get("tie", TIE)
    if not isinstance(tie, (int, float)) or isinstance(tie, bool) or not tie >= 0:
        raise ConfigError(f"{where}.tie must be a criterion difference >= 0 below which trials tie, got {tie!r}")
    search = Search(
        variant,
        tuple(chosen),
        table["criterion"],
        float(gamma),
        table["higher_is_better"],
        qualify,
        seed,
        tuple(map(float, gammas)),
        name,
        tuple(labels),
        tuple(takes),
        float(tie),
    )
    names = [search.trial_name(t) for t in search.trials]
    if len(set(names)) != len(names):
        clash = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{where}: two trials would share the run name {clash!r}; give them distinct values")
    return search


def search_table(search: Search) -> dict:
    """A Search as the ``[bench.tuning.VARIANT]`` table :func:`parse_search` reads back (its trials listed)."""
    return {
        "trials": [dict(t) for t in search.trials],
        "criterion": search.criterion,
        "gamma": search.gamma,
        "higher_is_better": search.higher_is_better,
        "qualify": search.qualify,
        "seed": search.seed,
        "gammas": list(search.gammas),
        **({"name": search.name} if search.name else {}),
        **({"labels": list(search.labels)} if search.labels else {}),
        **({"takes": list(search.takes)} if search.takes else {}),
        **({"tie": search.tie} if search.tie != TIE else {}),
    }


def _criterion(search: Search, results: dict) -> float | None:
    """The trial's criterion at ``search.gamma``; None where the run did not record it."""
    if search.criterion == BEST_VAL_LOSS:  # its trials validate at gamma during training (see the bench's plan)
        value = (results.get("train", {}).get("best_val_loss") or [None])[-1]
        return float(value) if value is not None and math.isfinite(value) else None
    record = next((r for r in results.get("gammas", []) if float(r["gamma"]) == search.gamma), None)
    if record is None:
        return None
    value = record["layer_loss"][-1] if search.criterion == "loss" else record.get("metrics", {}).get(search.criterion)
    return float(value) if value is not None and math.isfinite(value) else None


def _binds(results: dict) -> bool:
    return any(x > 0 for table in results.get("constraints", {}).values() for x in table.get("lambda", []))


def decide(search: Search, out: Path) -> dict | None:
    """The rule applied to the finished trials under ``out``: the adopted settings and every trial; None while one is still to run."""
    trials = []
    for trial in search.trials:
        run_dir = search.run_dir(out, trial)
        failed = rundir.failure(run_dir) is not None
        if not failed and not (run_dir / "results.json").exists():
            return None
        results = {} if failed else read_results(run_dir / "results.json")
        value = None if failed else _criterion(search, results)
        qualifies = value is not None and (search.qualify == "any" or _binds(results))
        trials.append({"run": search.trial_name(trial), "settings": dict(trial), "value": value, "failed": failed, "qualifies": qualifies})
    sign = -1.0 if search.higher_is_better else 1.0
    best = None
    for t in trials:  # the first of the best: a later trial wins only by more than TIE
        if t["qualifies"] and (best is None or sign * t["value"] < sign * best["value"] - search.tie):
            best = t
    return {
        "search": search_table(search),
        "adopted": best["settings"] if best else None,
        "adopted_run": best["run"] if best else None,
        "budget": len(trials),
        "rule": {
            "criterion": search.criterion,
            "gamma": search.gamma,
            "higher_is_better": search.higher_is_better,
            "qualify": search.qualify,
            "tie": f"within {search.tie:g}: the trial listed first",
        },
        "trials": trials,
    }


def decision_for(search: Search, decisions: dict) -> dict | None:
    """The recorded decision of ``search``'s variant, if that search made it (a changed search is decided again); else None."""
    decision = decisions.get(search.variant)
    return decision if isinstance(decision, dict) and decision.get("search") == search_table(search) else None


def read_adopted(out: Path) -> dict:
    """``OUT/tuning.json``: each tuned variant's decision; empty where no search has been decided."""
    try:
        data = json.loads((Path(out) / ADOPTED).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_adopted(out: Path, decisions: dict) -> None:
    """Record the decisions beside the results (sorted keys, so writing them again unchanged changes no byte)."""
    write_atomic(Path(out) / ADOPTED, json.dumps(decisions, indent=1, sort_keys=True) + "\n")
