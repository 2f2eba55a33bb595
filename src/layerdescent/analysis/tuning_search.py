"""A declared tuning search: ``[bench.tuning.VARIANT]`` read and checked, its trials and the names of their runs.

    [bench.tuning.levels]                       # the main variant "levels" is tuned first
    trials = [                                  # each a set of dotted config keys; or `space`, a grid of them
        { "solver.dual_lr" = 5.0, "constraints.0.alpha" = 0.05 },
        { "solver.dual_lr" = 50.0, "constraints.0.alpha" = 0.05 },
    ]
    criterion = "loss"                          # the last layer's validation loss, a metric the task reports, or
                                                # "best_val_loss" (the kept epoch's last layer, during training)
    gamma = 1.0                                 # read at this validation gamma (best_val_loss: trained with it)
    higher_is_better = false
    qualify = "binds"                           # "binds": only a setting whose multipliers bind at the end (in every seed); "any"
    seed = 100                                  # the tuning runs' seed (default 100); or seeds = [100, 101, 102]
    gammas = [0.0, 0.5, 1.0]                    # the tuning runs' validation grid (default [gamma])
    name = "levels"                             # the trials' labels, tune-NAME,... (default: the variant's)
    labels = ["alpha=0.05,lr=5", ...]           # optional: each trial's label after tune-NAME, (default KEY=VALUE,...)
    takes = ["levels-pooled"]                   # optional: other variants trained at the adopted settings too
    tie = 1e-9                                  # criterion values this close are a tie (default 1e-9)

A seeded Optuna sampler searches a continuous space instead (``pip install 'layerdescent[tune]'``):

    [bench.tuning.levels]
    sampler = "tpe"                             # or "random"; the default, "grid", is the form above
    space = { "solver.dual_lr" = { low = 0.5, high = 50.0, log = true }, "model.layers" = { low = 1, high = 8, int = true } }
    n_trials = 12                               # the trials it proposes
    sampler_seed = 0                            # the same seed and results propose the same trials (default 0)
    round = 4                                   # tpe: trials proposed together from the rounds before (default 4);
                                                # the first round is random, tpe models the rest
    criterion = "loss"                          # and the rest as above, but labels

Each trial is a run ``tune-VARIANT,KEY=VALUE,...`` (a sampler's ``tune-VARIANT,trial=K,KEY=VALUE,...``)
at each seed, evaluated on the validation split only. The budget a report states is the runs:
trials x seeds.

A trial's name is its run's folder: a name outside a safe alphabet (a value with a ``/``, say) is
replaced by ``tune-NAME,`` and a short hash of it; its values are in the run's config and tuning.json.

A trial's outcome is read in ``tuning_outcome``, a sampler's trials proposed in ``tuning_sampler``,
and the rule that adopts one applied in ``tuning``.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerdescent.errors import ConfigError
from layerdescent.optional import check_installed
from layerdescent.options import refuse_unknown
from layerdescent.run.config import check_seed

TIE = 1e-9  # criterion values this close are a tie, decided by the trials' order
SEARCH_HELP = {
    "trials": "a list of settings, each a table of dotted config keys, in order of preference (or `space`)",
    "space": "a grid: dotted config keys mapped to lists of values, every combination a trial; with a sampler, ranges `{ low, high, log, int }`",
    "criterion": '"loss" (the last layer\'s validation loss), "best_val_loss" (the kept epoch\'s, during training) or a metric the task reports',
    "gamma": "the validation perturbation level the criterion is read at",
    "higher_is_better": "the criterion's direction",
    "qualify": '"any" (default), or "binds": only a setting whose multipliers bind at the end, in every seed',
    "seed": "the tuning runs' seed (default 100); or `seeds`",
    "seeds": "the seeds each trial trains at, its criterion their mean (a failed seed disqualifies it); the budget counts trials x seeds",
    "gammas": "the tuning runs' validation grid (default [gamma])",
    "name": "the trials' label stem, tune-NAME,... (default: the variant's)",
    "labels": "each trial's label after the stem (default: its KEY=VALUE pairs)",
    "takes": "other variants trained at the adopted settings too",
    "tie": "criterion values this close are a tie, decided by the trials' order (default 1e-9)",
    "sampler": '"grid" (default), or a seeded Optuna sampler over ranges: "tpe" or "random" (pip install \'layerdescent[tune]\')',
    "n_trials": "a sampler's trials",
    "sampler_seed": "the sampler's seed: the same seed and results propose the same trials, resumed or not (default 0)",
    "round": "tpe: the trials proposed together from the rounds before (default 4); the first round is random",
}
SEARCH_KEYS = set(SEARCH_HELP)
BEST_VAL_LOSS = "best_val_loss"  # the criterion read from training: the kept epoch's last-layer validation loss
QUALIFY = ("any", "binds")
SAMPLERS = ("grid", "tpe", "random")
ROUND = 4  # a tpe search's trials proposed together: parallel work for a few workers, history for the rest
MAX_TRIALS = 10_000  # as many as a bench's runs (bench.plan.MAX_RUNS), so a typo'd grid is refused before it is expanded
MAX_SEEDS = 100
MAX_GAMMAS = 1_000
RESERVED = ("label", "seed")  # a run's label is its trial's name and its seeds the search's: a trial setting them would lie
# Characters a folder name may hold as it is: every name the committed benches use, and none that leads out of a folder.
SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,=+@ -]{0,119}")


def safe_name(name: str, stem: str = "") -> str:
    """``name`` as one folder under --out: itself where its characters are safe, else ``stem`` (when safe) and a short hash of it."""
    if SAFE.fullmatch(name) and not name.endswith((" ", ".")):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{stem},{digest}" if stem and SAFE.fullmatch(stem) else f"h-{digest}"


Trial = tuple[tuple[str, Any], ...]  # a trial's (dotted key, value) pairs


@dataclass(frozen=True)
class Range:
    """One key of a sampler's space: ``low`` to ``high``, on a log scale or over the integers where declared."""

    low: float
    high: float
    log: bool = False
    int: bool = False

    def table(self) -> dict:
        """The range as its TOML table (defaults omitted)."""
        return {"low": self.low, "high": self.high, **({"log": True} if self.log else {}), **({"int": True} if self.int else {})}


@dataclass(frozen=True)
class Search:
    """A declared tuning rule: the settings a variant tries on validation, the criterion that picks one, and what qualifies."""

    variant: str
    trials: tuple[Trial, ...]  # a grid's trials, in preference order (a sampler's are proposed from results: see trials_of)
    criterion: str
    gamma: float
    higher_is_better: bool = False
    qualify: str = "any"
    seeds: tuple[int, ...] = (100,)
    gammas: tuple[float, ...] = ()
    name: str = ""  # the trials' label stem (default: the variant's)
    labels: tuple[str, ...] = ()  # each trial's label after the stem (default: its KEY=VALUE pairs)
    takes: tuple[str, ...] = ()  # other variants trained at the adopted settings
    tie: float = TIE
    sampler: str = "grid"
    ranges: tuple[tuple[str, Range], ...] = ()  # a sampler's space
    n_trials: int = 0  # a sampler's trials
    sampler_seed: int = 0
    round: int = ROUND

    @property
    def stem(self) -> str:
        """The trials' common label prefix, ``tune-NAME``."""
        return f"tune-{self.name or self.variant}"

    @property
    def size(self) -> int:
        """How many trials the search tries."""
        return self.n_trials if self.sampler != "grid" else len(self.trials)

    @property
    def runs(self) -> int:
        """The runs the search trains: trials x seeds, its budget."""
        return self.size * len(self.seeds)

    def trial_name(self, trial: Trial, number: int | None = None) -> str:
        """A trial's run label: ``tune-NAME,alpha=0.05,dual_lr=5``, NAME the variant's unless the search names its own; a sampler's trial ``number`` is in it."""
        if self.labels:
            readable = f"{self.stem},{self.labels[self.trials.index(trial)]}"
        else:
            numbered = [f"trial={number}"] if number is not None else []
            readable = ",".join([self.stem, *numbered, *(f"{key.rsplit('.', 1)[-1]}={_short(value)}" for key, value in trial)])
        return safe_name(readable, self.stem)

    def run_dirs(self, out: Path, name: str) -> list[Path]:
        """Where a trial runs in the bench folder ``out``: ``OUT/tune-NAME,.../seed-SEED``, one a seed."""
        return [Path(out) / name / f"seed-{seed}" for seed in self.seeds]


def _short(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _trials(where: str, table: dict) -> list[Trial]:
    """A grid search's trials, listed or crossed from ``space``; the grid's size is checked before it is expanded."""
    if "trials" in table:
        trials = table["trials"]
        if not isinstance(trials, list) or not trials or not all(isinstance(t, dict) and t for t in trials):
            raise ConfigError(f'{where}.trials must be a non-empty list of settings, e.g. [{{ "solver.dual_lr" = 5.0 }}]')
        if len(trials) > MAX_TRIALS:
            raise ConfigError(f"{where}.trials lists {len(trials):,} trials; at most {MAX_TRIALS:,}: search fewer settings")
        return [tuple(t.items()) for t in trials]
    space = table["space"]
    if not isinstance(space, dict) or not space or not all(isinstance(v, list) and v for v in space.values()):
        raise ConfigError(
            f'{where}.space must map dotted config keys to non-empty lists, e.g. "solver.dual_lr" = [0.5, 5.0] '
            '(ranges, { low = 0.5, high = 50.0 }, need sampler = "tpe" or "random")'
        )
    size = math.prod(len(v) for v in space.values())
    if size > MAX_TRIALS:
        raise ConfigError(
            f"{where}.space is a grid of {size:,} trials; at most {MAX_TRIALS:,}: search fewer values, or a sampler with n_trials"
        )
    return [tuple(zip(space, point)) for point in itertools.product(*space.values())]


def _ranges(where: str, table: dict) -> tuple[tuple[str, Range], ...]:
    """A sampler's ``space``: each dotted key a range ``{ low, high }``, optionally ``log = true`` or ``int = true``."""
    space = table.get("space")
    example = '"solver.dual_lr" = { low = 0.5, high = 50.0, log = true }'
    if "trials" in table or not isinstance(space, dict) or not space or not all(isinstance(v, dict) for v in space.values()):
        raise ConfigError(f"{where}.space must map dotted config keys to ranges for its sampler, e.g. {example} (no trials)")
    ranges = []
    for key, r in space.items():
        log, integer = r.get("log", False), r.get("int", False)
        low, high = r.get("low"), r.get("high")
        ok = (
            set(r) <= {"low", "high", "log", "int"}
            and _number(low)
            and _number(high)
            and low < high
            and isinstance(log, bool)
            and isinstance(integer, bool)
            and (not log or low > 0)
            and (not integer or (isinstance(low, int) and isinstance(high, int)))
        )
        if not ok:
            raise ConfigError(
                f"{where}.space.{key} must be {{ low, high }} with low < high (log = true: low > 0; int = true: integer bounds), e.g. {example}"
            )
        ranges.append((key, Range(low if integer else float(low), high if integer else float(high), log, integer)))
    return tuple(ranges)


def _seeds(where: str, table: dict) -> tuple[int, ...]:
    """The trials' seeds: ``seeds`` (a list) or ``seed`` (one), not both."""
    if "seed" in table and "seeds" in table:
        raise ConfigError(f"{where} has seed and seeds: keep one (seed = 100, or seeds = [100, 101, 102])")
    seeds = table["seeds"] if "seeds" in table else [table.get("seed", 100)]
    key = f"{where}.seeds" if "seeds" in table else f"{where}.seed"
    if (
        not isinstance(seeds, list)
        or not 0 < len(seeds) <= MAX_SEEDS
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise ConfigError(
            f"{key} must be an integer, or seeds a list of 1 to {MAX_SEEDS} distinct integers, got {table.get('seeds', table.get('seed'))!r}"
        )
    for seed in seeds:
        check_seed(seed, key)
    return tuple(seeds)


def _count(where: str, table: dict, key: str, default: int, low: int, high: int) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"{where}.{key} must be an integer from {low} to {high:,}, got {value!r}")
    return value


def parse_search(variant: str, table: Any) -> Search:
    """``[bench.tuning.VARIANT]`` as a Search; ConfigError, one line, for a missing, unknown or mistyped key."""
    where = f"bench.tuning.{variant}"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a number of runs or a table (trials or space, criterion, gamma)")
    refuse_unknown(where, table, SEARCH_KEYS)
    sampler = table.get("sampler", "grid")
    if sampler not in SAMPLERS:
        raise ConfigError(f"{where}.sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
    if sampler == "grid":
        extra = next((key for key in ("n_trials", "sampler_seed", "round") if key in table), None)
        if extra:
            raise ConfigError(f'{where}.{extra} is a sampler\'s: set sampler = "tpe" or "random", or list the trials')
        if ("trials" in table) == ("space" in table):
            raise ConfigError(f"{where} needs trials (a list of settings) or space (a grid of them), one of the two")
        chosen, ranges = _trials(where, table), ()
        n_trials = sampler_seed = 0
    else:
        check_installed({"optuna": "layerdescent[tune]"}, f"{where}.sampler = {sampler!r}")
        ranges = _ranges(where, table)
        if "labels" in table:
            raise ConfigError(f"{where}.labels names listed trials; a sampler's are named by their number and values")
        chosen = []
        n_trials = _count(where, table, "n_trials", 0, 1, MAX_TRIALS)
        sampler_seed = _count(where, table, "sampler_seed", 0, 0, 2**32 - 1)
    round_ = _count(where, table, "round", ROUND, 1, MAX_TRIALS)
    keys = [key for trial in chosen for key, _ in trial] + [key for key, _ in ranges]
    for key in keys:
        if key in RESERVED:
            raise ConfigError(f"{where}: a trial may not set {key!r} (its run's {key} is the search's); tune other keys")
    for key in ("criterion", "gamma", "higher_is_better"):
        if key not in table:
            raise ConfigError(f"{where} lacks {key!r} (a search needs criterion, gamma and higher_is_better)")
    if not isinstance(table["criterion"], str) or not table["criterion"]:
        raise ConfigError(f'{where}.criterion must be "loss" (the last layer\'s), "{BEST_VAL_LOSS}" or a metric the task reports')
    if not isinstance(table["higher_is_better"], bool):
        raise ConfigError(f"{where}.higher_is_better must be true or false")
    gamma = table["gamma"]
    if not _number(gamma) or not gamma >= 0:
        raise ConfigError(f"{where}.gamma must be one perturbation level >= 0, got {gamma!r}")
    qualify = table.get("qualify", "any")
    if qualify not in QUALIFY:
        raise ConfigError(f"{where}.qualify must be one of {', '.join(QUALIFY)}, got {qualify!r}")
    seeds = _seeds(where, table)
    gammas = table.get("gammas", [gamma])
    if (
        not isinstance(gammas, list)
        or not 0 < len(gammas) <= MAX_GAMMAS
        or not all(_number(g) and g >= 0 for g in gammas)
        or float(gamma) not in [float(g) for g in gammas]
    ):
        raise ConfigError(
            f"{where}.gammas must be a list of validation gammas that holds gamma ({gamma:g}), each a number >= 0, at most {MAX_GAMMAS}"
        )
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
    if not _number(tie) or not tie >= 0:
        raise ConfigError(f"{where}.tie must be a criterion difference >= 0 below which trials tie, got {tie!r}")
    search = Search(
        variant,
        tuple(chosen),
        table["criterion"],
        float(gamma),
        table["higher_is_better"],
        qualify,
        seeds,
        tuple(map(float, gammas)),
        name,
        tuple(labels),
        tuple(takes),
        float(tie),
        sampler,
        ranges,
        n_trials,
        sampler_seed,
        round_,
    )
    names = [search.trial_name(t) for t in search.trials]
    if len(set(names)) != len(names):
        clash = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{where}: two trials would share the run name {clash!r}; give them distinct values")
    return search


def search_table(search: Search) -> dict:
    """A Search as the ``[bench.tuning.VARIANT]`` table :func:`parse_search` reads back (a grid's trials listed; defaults a one-seed grid never had omitted)."""
    if search.sampler == "grid":
        chosen: dict = {"trials": [dict(t) for t in search.trials]}
    else:
        chosen = {
            "sampler": search.sampler,
            "space": {key: r.table() for key, r in search.ranges},
            "n_trials": search.n_trials,
            "sampler_seed": search.sampler_seed,
        }
    return {
        **chosen,
        "criterion": search.criterion,
        "gamma": search.gamma,
        "higher_is_better": search.higher_is_better,
        "qualify": search.qualify,
        **({"seed": search.seeds[0]} if len(search.seeds) == 1 else {"seeds": list(search.seeds)}),
        "gammas": list(search.gammas),
        **({"name": search.name} if search.name else {}),
        **({"labels": list(search.labels)} if search.labels else {}),
        **({"takes": list(search.takes)} if search.takes else {}),
        **({"tie": search.tie} if search.tie != TIE else {}),
        **({"round": search.round} if search.round != ROUND else {}),
    }
