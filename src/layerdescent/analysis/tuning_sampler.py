"""A tuning search's seeded Optuna sampler: the trials it proposes, round by round, and its study kept for Optuna's tools.

A sampler proposes trial K of a round from the trials of the rounds before it alone, with a sampler
seeded by (sampler_seed, K), so an interrupted search, resumed, proposes exactly the trials an
uninterrupted one would, however many workers train them. Its study, ``OUT/tuning-VARIANT.optuna``,
is a record for Optuna's tools (``pip install 'layerdescent[tune]'``), never what the bench proposes from.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from layerdescent.analysis.tuning_outcome import trial_outcome
from layerdescent.analysis.tuning_search import Search, Trial, safe_name
from layerdescent.errors import ConfigError
from layerdescent.optional import check_installed
from layerdescent.run.files import refuse_links


def _sampler(optuna: Any, search: Search, number: int) -> Any:
    """A sampler for trial ``number`` alone, seeded by (sampler_seed, number): Optuna keeps no sampler state in a study."""
    seed = int.from_bytes(hashlib.sha256(f"{search.sampler_seed}:{number}".encode()).digest()[:4], "big")
    if search.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # the first round is the start-up, random; Optuna's default (10 trials) would leave a small search no modelled round
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=search.round)


def _distributions(optuna: Any, search: Search) -> dict:
    return {
        key: optuna.distributions.IntDistribution(r.low, r.high, log=r.log)
        if r.int
        else optuna.distributions.FloatDistribution(r.low, r.high, log=r.log)
        for key, r in search.ranges
    }


def _optuna() -> Any:
    check_installed({"optuna": "layerdescent[tune]"}, "a search with a sampler")
    import optuna  # lazily: an optional dependency, and slow to import

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _history(optuna: Any, search: Search, distributions: dict, outcomes: list[dict]) -> list:
    """The finished trials as Optuna's: a qualifying trial complete with its criterion, any other failed (it qualifies for nothing)."""
    return [
        optuna.trial.create_trial(
            params=o["settings"],
            distributions=distributions,
            value=o["value"] if o["qualifies"] else None,
            state=optuna.trial.TrialState.COMPLETE if o["qualifies"] else optuna.trial.TrialState.FAIL,
        )
        for o in outcomes
    ]


def proposals(search: Search, out: Path) -> tuple[list[tuple[str, Trial]], list[dict]]:
    """A sampler's trials proposed so far, and the outcomes of the finished rounds.

    Trial K is proposed in its round (``round`` trials; a random sampler's whole search is one) from
    the finished trials of the rounds before alone, so neither the order trials finish in nor the
    workers that train them changes what is proposed.
    """
    optuna = _optuna()
    distributions = _distributions(optuna, search)
    direction = "maximize" if search.higher_is_better else "minimize"
    size = search.n_trials if search.sampler == "random" else search.round
    proposed, outcomes = [], []
    for start in range(0, search.n_trials, size):
        history = _history(optuna, search, distributions, outcomes)
        for number in range(start, min(start + size, search.n_trials)):
            study = optuna.create_study(direction=direction, sampler=_sampler(optuna, search, number))
            study.add_trials(history)
            params = study.ask(distributions).params
            trial = tuple((key, params[key]) for key, _ in search.ranges)
            proposed.append((search.trial_name(trial, number), trial))
        for name, trial in proposed[start:]:
            outcome = trial_outcome(search, out, name, trial)
            if outcome is None:  # the round is still training: the next is proposed once it has finished
                return proposed, outcomes
            outcomes.append(outcome)
    return proposed, outcomes


def study_path(out: Path, search: Search) -> Path:
    """Where a sampler's study is kept for Optuna's own tools: ``OUT/tuning-VARIANT.optuna``."""
    return Path(out) / f"tuning-{safe_name(search.variant)}.optuna"


def record_study(search: Search, out: Path) -> None:
    """Keep a sampler's finished trials as an Optuna study (a journal file) in ``out``, refused where it disagrees with them.

    Optuna's tools (``optuna.load_study``, the dashboard) read it; the bench itself proposes from
    the trials' results, so a deleted study is only written again.
    """
    optuna = _optuna()
    path = study_path(out, search)
    refuse_links(Path(out), (path.name,))
    distributions = _distributions(optuna, search)
    _, outcomes = proposals(search, Path(out))
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    direction = "maximize" if search.higher_is_better else "minimize"
    study = optuna.create_study(storage=storage, study_name=search.variant, direction=direction, load_if_exists=True)
    kept = study.get_trials(deepcopy=False)
    history = _history(optuna, search, distributions, outcomes)
    for number, (old, new) in enumerate(zip(kept, history)):
        if old.params != new.params or old.state != new.state or old.values != new.values:
            raise ConfigError(f"{path} records trial {number} of {search.variant} otherwise than its results: delete it and rerun")
    study.add_trials(history[len(kept) :])
