"""Run configuration: TOML in, validated frozen dataclasses out, one clear line on any mistake.

    config = load_config("run.toml", overrides=["solver.dual_lr=0.1"])
    config.solver.name, config.solver.dual_lr, config.constraints[0].alpha

Every key is checked: an unknown key or name gets the closest valid one, a wrong type or an
out-of-range value names the key and what is allowed (:class:`ConfigError`).

Over 400 lines on purpose: the config tables and their checks, each key with the docstring that
``layerdescent config --reference`` prints as its documentation.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from layerdescent.core.constraints import ConstraintSpec
from layerdescent.core.optimizers import OptimizerName
from layerdescent.core.solvers import PrimalDualOptions
from layerdescent.errors import ConfigError, closest
from layerdescent.options import Choice, Problems, build_dataclass, build_solver_options, coerce, plain
from layerdescent.registry import Registry, get_registry
from layerdescent.run.config_file import apply_overrides, read_toml

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - exercised on Python 3.10 only
    pass

SEED_MAX = 2**32 - 1  # numpy's seeds are 32-bit; a larger one would crash after training
# More torch threads than this segfaults or thrashes; a recorded config must still load on a smaller machine.
MAX_THREADS = max(256, 4 * (os.cpu_count() or 1))
MAX_LABEL = 200  # a label names a directory: one path component, well under the 255-byte limit
MAX_DEPTH = 64  # tables and arrays nested deeper than this are not a config
# Far above any real run, so that an extra digit is refused in one line instead of training until killed.
MAX_EPOCHS = 1_000_000
MAX_STEPS = 10**9  # optimizer steps in one run: years of training at a millisecond a step
MAX_COUNT = 2**31 - 1  # batch sizes, intervals, patience: int32, what a torch index or a step counter holds


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key} {message}")


def check_seed(value: int, key: str) -> None:
    """Raise ConfigError unless ``value`` is a seed every RNG accepts (0..2**32-1)."""
    _require(0 <= value <= SEED_MAX, key, f"must be in 0..{SEED_MAX} (2**32-1), got {value}")


def check_label(label: str, key: str = "label") -> None:
    """Raise ConfigError unless ``label`` can name one directory: no separator, not '.' or '..', not too long."""
    if "/" in label or "\\" in label or "\0" in label:
        raise ConfigError(f"{key} = {label!r} must be a plain name without '/', '\\' or NUL: it names a run directory")
    _require(label not in (".", ".."), key, f"= {label!r} is not a name: it names a run directory")
    _require(len(label.encode()) <= MAX_LABEL, key, f"is {len(label.encode())} bytes long; at most {MAX_LABEL} (it names a run directory)")


@dataclass(frozen=True)
class TaskConfig:
    """Which task to train and its task-specific options."""

    name: str
    """A registered task (`layerdescent list`); every other `[task]` key is one of its options."""
    options: dict[str, Any] = field(default_factory=dict)


class LrSchedule(Choice):
    """The model optimizer's learning-rate schedule (``train.lr_schedule``)."""

    CONSTANT = "constant"
    COSINE = "cosine"


class Precision(Choice):
    """The training forward pass's precision (``train.precision``)."""

    FP32 = "fp32"
    BF16 = "bf16"


class OnNonfinite(Choice):
    """What a NaN or infinite loss does to the run (``train.on_nonfinite``)."""

    STOP = "stop"
    SKIP = "skip"


@dataclass(frozen=True)
class TrainConfig:
    """The primal loop: optimizer, batches, threads, logging and checkpoints."""

    epochs: int = 10
    """Passes over the training split."""
    batch_size: int = 64
    """Rows per micro-batch, global: data-parallel ranks split it."""
    lr: float = 1e-3
    """The model optimizer's learning rate."""
    lr_schedule: LrSchedule = LrSchedule.CONSTANT
    """`cosine` anneals the rate to 0 over all the run's steps."""
    optimizer: OptimizerName = OptimizerName.ADAM
    """The model's optimizer (under `scheme = "extrapolation"`, Cooper's ExtraAdam or ExtraSGD)."""
    weight_decay: float = 0.0
    """The model optimizer's weight decay."""
    dropout: Union[float, None] = None
    """Every dropout layer's rate (text, llm); unset keeps the model's own."""
    momentum: float = 0.9
    """SGD's momentum (`optimizer = "sgd"` only)."""
    grad_clip: float = 0.0
    """Largest gradient norm; 0 is off."""
    accumulate: int = 1
    """Micro-batches per optimizer step."""
    # One perturbation level, or a band of them: each micro-batch draws one level of the band
    # (seeded, the same for every solver), or with gamma_sampling = "all" is taken at every level.
    train_gamma: Union[float, tuple[float, ...]] = 0.0
    """Perturbation level during training, the same for every solver, or a band of levels, e.g. `[0.0, 0.8, 1.6]`."""
    gamma_sampling: Literal["draw", "all"] = "draw"
    """With a band: `draw` one level per micro-batch, or take `all` levels in every step."""
    threads: int = 0
    """Torch threads; 0: one for a model under 500k parameters (its steps are too short to share), else torch's default (every core)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto` takes a GPU when there is one."""
    precision: Precision = Precision.FP32
    """`bf16`: the training forward pass under autocast; losses, multipliers, the dual step and evaluation stay float32."""
    log_every: int = 10
    """Optimizer steps per `metrics.jsonl` line."""
    checkpoint_every: int = 0
    """Steps between checkpoints; 0 writes one per epoch only."""
    validate: bool = True
    """Per-layer validation loss after every epoch."""
    validation_gamma: float = 0.0
    """The perturbation level of that validation (e.g. `train_gamma`, to select at the training noise)."""
    early_stopping: int = 0
    """Stop after this many epochs without a better last-layer validation loss, and test the best epoch's model; 0 is off."""
    progress: bool = True
    """A progress bar; a line every 30 s when stderr is not a terminal."""
    on_nonfinite: OnNonfinite = OnNonfinite.STOP
    """What a NaN or infinite loss does: `stop` the run, or `skip` that step (logged and counted)."""
    keep_checkpoint: bool = False
    """Keep `checkpoint.pt` (optimizer state) once the run finished, to train it further."""
    trackers: Union[tuple[str, ...], dict] = ()
    """Registered listeners on the metrics log (`layerdescent list` shows them): a list of names, each at its defaults, or a table of their options, `[train.trackers.mlflow]`."""

    def __post_init__(self) -> None:
        for key in ("epochs", "batch_size", "accumulate", "log_every"):
            _require(getattr(self, key) >= 1, f"train.{key}", "must be >= 1")
        _require(self.epochs <= MAX_EPOCHS, "train.epochs", f"must be at most {MAX_EPOCHS:,}, got {self.epochs}")
        for key in ("batch_size", "accumulate", "log_every", "checkpoint_every", "early_stopping"):
            _require(getattr(self, key) <= MAX_COUNT, f"train.{key}", f"must be at most {MAX_COUNT:,}, got {getattr(self, key)}")
        _require(self.early_stopping >= 0, "train.early_stopping", "must be >= 0 (epochs without a better validation loss; 0 is off)")
        _require(
            self.validate or not self.early_stopping, "train.early_stopping", "needs train.validate = true: it watches the validation loss"
        )
        for key in ("lr",):
            _require(getattr(self, key) > 0, f"train.{key}", "must be > 0")
        if self.dropout is not None:
            _require(0 <= self.dropout < 1, "train.dropout", f"must be in [0, 1), got {self.dropout}")
        for key in ("weight_decay", "momentum", "grad_clip", "validation_gamma", "threads", "checkpoint_every"):
            _require(getattr(self, key) >= 0, f"train.{key}", "must be >= 0")
        _require(len(self.band) > 0, "train.train_gamma", "must hold at least one level")
        _require(all(g >= 0 for g in self.band), "train.train_gamma", "must be >= 0 (every level of the band)")
        _require(len(set(self.band)) == len(self.band), "train.train_gamma", "names a level twice")
        _require(
            self.gamma_sampling == "draw" or len(self.band) > 1,
            "train.gamma_sampling",
            "= 'all' needs a band: set train.train_gamma to a list of levels",
        )
        _require(
            self.threads <= MAX_THREADS,
            "train.threads",
            f"must be at most {MAX_THREADS} (this machine has {os.cpu_count()} cores; 0 chooses), got {self.threads}",
        )
        # whether each tracker is registered and its package installed is checked when a run trains
        # (check_trackers), so that report and evaluate still read a recorded run on a machine without it
        _require(len(set(self.trackers)) == len(self.trackers), "train.trackers", "lists a tracker twice")
        for name, table in self.tracker_tables.items():
            _require(
                isinstance(table, dict),
                f"train.trackers.{name}",
                f"must be a table of that tracker's options (an empty one takes its defaults), got {table!r}",
            )

    @property
    def tracker_tables(self) -> dict[str, dict[str, Any]]:
        """Each tracker's options table by name: empty for a tracker named in a list."""
        return dict(self.trackers) if isinstance(self.trackers, dict) else {name: {} for name in self.trackers}

    @property
    def band(self) -> tuple[float, ...]:
        """The training perturbation levels: ``train_gamma`` as a tuple (one level when it is a number)."""
        return self.train_gamma if isinstance(self.train_gamma, tuple) else (self.train_gamma,)


@dataclass(frozen=True)
class SolverConfig:
    """Which registered solver turns layer losses into updates, and its options (the solver's ``Options``)."""

    name: str = "primal-dual"
    """A registered solver: `erm`, `penalty`, `primal-dual` or a plugin's (`layerdescent list`)."""
    options: Any = None  # an instance of the solver's Options dataclass, defaults filled in

    def __getattr__(self, key: str) -> Any:
        # config.solver.dual_lr reads the solver's own option
        options = self.__dict__.get("options")
        if options is not None and not key.startswith("__") and hasattr(options, key):
            return getattr(options, key)
        raise AttributeError(f"solver {self.__dict__.get('name')!r} has no option {key!r}")


@dataclass(frozen=True)
class EvalConfig:
    """The perturbation grid, split and extra domains the final evaluation runs on."""

    gammas: tuple[float, ...] = (0.0,)
    """The perturbation levels of the final evaluation."""
    split: Literal["test", "validation"] = "test"
    """The split it tests on."""
    batch_size: int = 256
    """Rows per evaluation batch."""
    seed: int = 1234
    """Seeds the evaluation noise, identical for every run."""
    domains: tuple[str, ...] = ()
    """The task's other test sets (a real shift, same labels), each tested at every gamma."""
    domain_samples: int = 0
    """At most this many rows per domain, a fixed random subset; 0 keeps all."""

    def __post_init__(self) -> None:
        _require(len(self.gammas) > 0, "eval.gammas", "must hold at least one level")
        _require(all(g >= 0 for g in self.gammas), "eval.gammas", "must all be >= 0")
        check_seed(self.seed, "eval.seed")
        _require(self.batch_size >= 1, "eval.batch_size", "must be >= 1")
        _require(self.domain_samples >= 0, "eval.domain_samples", "must be >= 0 (0 keeps every row)")
        for key in ("batch_size", "domain_samples"):
            _require(getattr(self, key) <= MAX_COUNT, f"eval.{key}", f"must be at most {MAX_COUNT:,}, got {getattr(self, key)}")
        _require(len(set(self.domains)) == len(self.domains), "eval.domains", "names a domain twice")


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs; ``as_dict()`` is what run directories record."""

    task: TaskConfig
    seed: int = 0
    """Seeds python, numpy, torch and the data order."""
    label: str = ""
    """The run's name in reports and its directory (default: the solver's name)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    solver: SolverConfig = field(default_factory=lambda: SolverConfig("primal-dual", PrimalDualOptions()))
    eval: EvalConfig = field(default_factory=EvalConfig)
    constraints: tuple[ConstraintSpec, ...] = ()

    @property
    def name(self) -> str:
        """The run's label, or its solver when it has none."""
        return self.label or self.solver.name

    def as_dict(self) -> dict[str, Any]:
        """Plain TOML-able data that ``config_from_dict`` turns back into this config."""
        out: dict[str, Any] = {"seed": self.seed}
        if self.label:
            out["label"] = self.label
        out["task"] = {"name": self.task.name, **self.task.options}
        out["train"] = _plain(dataclasses.asdict(self.train))
        out["solver"] = {"name": self.solver.name, **_plain(dataclasses.asdict(self.solver.options))}
        out["eval"] = _plain(dataclasses.asdict(self.eval))
        out["constraints"] = [{"kind": c.kind, **_plain(dataclasses.asdict(c))} for c in self.constraints]
        # A run that leaves a newer option at its default records the same config.toml as before it existed.
        if not self.train.trackers:
            del out["train"]["trackers"]
        if self.train.gamma_sampling == "draw":
            del out["train"]["gamma_sampling"]
        if self.train.precision == Precision.FP32:
            del out["train"]["precision"]
        for constraint in out["constraints"]:
            if not constraint["per_sample"]:
                del constraint["per_sample"]
        return out


def _plain(data: dict[str, Any]) -> dict[str, Any]:
    # TOML has no null and no tuples: drop unset options, turn tuples into lists
    return {k: plain(v) for k, v in data.items() if v is not None}


def _option_type(default: Any) -> Any:
    """The type a task option's default implies; None accepts anything."""
    if isinstance(default, (list, tuple)):
        return tuple[type(default[0]), ...] if default else None  # type: ignore[misc]
    return None if default is None else type(default)


def _build_task(data: Any, registry: Registry) -> TaskConfig:
    if isinstance(data, str):
        data = {"name": data}
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ConfigError('task.name is required: [task] name = "..." (see `layerdescent list`)')
    task_cls = registry.task(data["name"])
    options = {k: v for k, v in data.items() if k != "name"}
    allowed = {**task_cls.options, "perturbation": task_cls.perturbations[0]}
    resolved = dict(allowed)  # every default, so run directories record the whole task
    problems = Problems()
    for key, value in options.items():
        if key not in allowed:
            problems.add(
                ConfigError(f"unknown key task.{key}{closest(key, allowed)} (task {task_cls.name!r} accepts: {', '.join(allowed)})")
            )
            continue
        if key == "perturbation":
            value = problems.attempt(coerce, value, Literal[task_cls.perturbations], "task.perturbation")  # type: ignore[valid-type]
        elif (option_type := _option_type(allowed[key])) is not None:
            value = problems.attempt(coerce, value, option_type, f"task.{key}")
        resolved[key] = value
    problems.raise_any()
    return TaskConfig(task_cls.name, resolved)


def _build_solver(data: Any, registry: Registry) -> SolverConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"solver must be a table, got {data!r}")
    name = data.get("name", SolverConfig.name)
    if not isinstance(name, str) or name not in registry.solvers:
        known = ", ".join(sorted(registry.solvers))
        hint = closest(name, registry.solvers) if isinstance(name, str) else ""
        raise ConfigError(f"solver.name = {name!r} is not a registered solver{hint} (known: {known}; see `layerdescent list`)")
    solver_cls = registry.solver(name)
    return SolverConfig(name, build_solver_options(solver_cls, {k: v for k, v in data.items() if k != "name"}, registry.solvers.values()))


@functools.cache
def _reserved_names() -> frozenset[str]:
    """Constraint names that would overwrite an attribute of Cooper's CMP (they become its attributes)."""
    import cooper  # only when a config names constraints: cooper is slow to import

    return frozenset(dir(cooper.ConstrainedMinimizationProblem))


def _build_constraints(items: Any, registry: Registry) -> tuple[ConstraintSpec, ...]:
    if not isinstance(items, list):
        raise ConfigError('constraints must be an array of tables: [[constraints]] kind = "descent"')
    specs, seen, problems = [], set(), Problems()
    for i, item in enumerate(items):
        prefix = f"constraints[{i}]"
        if not isinstance(item, dict) or "kind" not in item:
            problems.add(ConfigError(f"{prefix}.kind is required (known kinds: {', '.join(sorted(registry.constraints))})"))
            continue
        if not isinstance(item["kind"], str):
            problems.add(
                ConfigError(
                    f"{prefix}.kind must be a string, got {item['kind']!r} (known kinds: {', '.join(sorted(registry.constraints))})"
                )
            )
            continue
        spec_cls = problems.attempt(registry.constraint, item["kind"])
        if spec_cls is None:
            continue
        data = {k: v for k, v in item.items() if k != "kind"}
        data.setdefault("name", spec_cls.kind)
        spec = problems.attempt(build_dataclass, spec_cls, data, prefix)
        if spec is None:
            continue
        if spec.name.startswith("_") or spec.name in _reserved_names():
            if spec.name not in seen:  # a reserved name given twice is one mistake, said once
                problems.add(
                    ConfigError(f"{prefix}.name {spec.name!r} is reserved (an attribute of Cooper's problem object); choose another name")
                )
        elif spec.name in seen:
            problems.add(ConfigError(f"{prefix}.name {spec.name!r} is used twice; give each [[constraints]] a distinct name"))
        seen.add(spec.name)
        specs.append(spec)
    problems.raise_any()
    return tuple(specs)


def _depth(value: Any, limit: int) -> int:
    """How deeply ``value`` nests tables and arrays, counting no further than ``limit``."""
    if limit <= 0 or not isinstance(value, (dict, list)):
        return 0
    children = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in children), default=0)


def config_from_dict(data: dict[str, Any], registry: Registry | None = None) -> RunConfig:
    """Validate a config table (as parsed from TOML) into a RunConfig; every mistake is reported, one line each."""
    from layerdescent.run.guard import build_task  # torch and datasets: a config is read where neither is loaded yet (the CLI)

    registry = registry or get_registry()
    if _depth(data, MAX_DEPTH + 1) > MAX_DEPTH:
        raise ConfigError(f"the config nests tables or arrays more than {MAX_DEPTH} deep; that is not a run config")
    data = copy.deepcopy(data)
    sections = {"task", "seed", "label", "train", "solver", "eval", "constraints"}
    problems = Problems()
    for key in data:
        if key not in sections:
            hint = "; a [bench] table belongs to `layerdescent bench`" if key == "bench" else closest(key, sections)
            problems.add(ConfigError(f"unknown key {key}{hint} (allowed: {', '.join(sorted(sections))})"))
    if "task" not in data:
        problems.add(ConfigError('task is required: [task] name = "..." (see `layerdescent list`)'))
        task_config = None
    else:
        task_config = problems.attempt(_build_task, data["task"], registry)
    seed = problems.attempt(coerce, data.get("seed", 0), int, "seed")
    if seed is not None:
        problems.attempt(check_seed, seed, "seed")
    label = problems.attempt(coerce, data.get("label", ""), str, "label")
    if label is not None:
        problems.attempt(check_label, label)
    parts = {
        section: problems.attempt(build_dataclass, cls, data.get(section, {}), section)
        for section, cls in (("train", TrainConfig), ("eval", EvalConfig))
    }
    parts["solver"] = problems.attempt(_build_solver, data.get("solver", {}), registry)
    constraints = problems.attempt(_build_constraints, data.get("constraints", []), registry)
    problems.raise_any()
    config = RunConfig(task=task_config, seed=seed, label=label, constraints=constraints, **parts)
    task = build_task(registry, config.task.name, config.task.options)
    task.check_gammas(config.eval.gammas, "eval.gammas")
    task.check_gammas(config.train.band, "train.train_gamma")
    for i, spec in enumerate(config.constraints):
        problems.attempt(check_levels, spec, config.train.band, f"constraints[{i}]")
    task.check_gammas([config.train.validation_gamma], "train.validation_gamma")
    for name in config.eval.domains:
        if name not in task.domains:
            offered = f"it offers: {', '.join(task.domains)}" if task.domains else "it offers none with these options"
            problems.add(
                ConfigError(f"eval.domains: {name!r} is not a domain of task {task.name!r}{closest(name, task.domains)} ({offered})")
            )
    problems.raise_any()
    return config


def check_levels(spec: ConstraintSpec, band: tuple[float, ...], prefix: str) -> None:
    """Raise ConfigError where a constraint holds at levels the training band does not have."""
    if spec.levels is None:
        return
    if len(band) < 2:
        raise ConfigError(f"{prefix}.levels needs a training band: set train.train_gamma to a list of levels, e.g. [0.0, 0.8, 1.6]")
    missing = [g for g in spec.held_levels(band) if g not in band]
    if missing:
        raise ConfigError(
            f"{prefix}.levels: {', '.join(f'{g:g}' for g in missing)} not in train.train_gamma's band ({', '.join(f'{g:g}' for g in band)})"
        )


def check_steps(train: TrainConfig, steps_per_epoch: int) -> None:
    """Raise ConfigError when ``train.epochs`` epochs of ``steps_per_epoch`` steps pass MAX_STEPS (a run that would never end)."""
    total = train.epochs * steps_per_epoch
    _require(
        total <= MAX_STEPS,
        "train.epochs",
        f"= {train.epochs} makes {total:,} optimizer steps ({steps_per_epoch:,} an epoch); at most {MAX_STEPS:,}: lower train.epochs",
    )


def check_depth(config: RunConfig, num_layers: int, registry: Registry | None = None) -> None:
    """Raise ConfigError, one line per problem, where the solver or a constraint names a layer a model of ``num_layers`` lacks.

    Apart from ``config_from_dict`` because the depth is known only once the task has read its
    model's config (a tokenizer, a converted checkpoint); the trainer calls it when it builds the task.
    """
    registry = registry or get_registry()
    problems = Problems()
    for line in registry.solver(config.solver.name).check(config.solver.options, num_layers, config.constraints):
        problems.add(ConfigError(line))
    for i, spec in enumerate(config.constraints):
        problems.attempt(spec.check_layers, num_layers, prefix=f"constraints[{i}]")
    problems.raise_any()


def load_config(path: str | Path, overrides: list[str] = (), registry: Registry | None = None, bench: bool = True) -> RunConfig:
    """Read, override and validate a run file; ``bench=False`` refuses a bench file instead of dropping its [bench] table."""
    data = read_toml(path)
    if "bench" in data and not bench:
        raise ConfigError(
            f"{path} is a bench file (it has a [bench] table): run every variant with `layerdescent bench {path}`; `run` would train its base config alone"
        )
    data.pop("bench", None)
    return config_from_dict(apply_overrides(data, list(overrides)), registry)
