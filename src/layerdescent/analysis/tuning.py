"""Tuning the tool runs: each search's trials known now, the rule that adopts one, and its record, ``OUT/tuning.json``.

Once every trial has finished or failed, the rule adopts the qualifying trial with the best
criterion; ties (within ``tie``) go to the trial listed first (so list the values in the order you
prefer them). The decision is always recomputed from the trials' own results; ``OUT/tuning.json``
records it beside the results, never into the bench file, checked against that recomputation.

The search a bench declares is ``tuning_search``, a trial's outcome ``tuning_outcome``, a sampler's
proposals ``tuning_sampler``.
"""

from __future__ import annotations

import json
from pathlib import Path

from layerdescent.analysis.tuning_outcome import trial_outcome
from layerdescent.analysis.tuning_sampler import proposals
from layerdescent.analysis.tuning_search import Search, Trial, search_table
from layerdescent.errors import ConfigError
from layerdescent.readback import read_json
from layerdescent.run.files import refuse_links, write_atomic

ADOPTED = "tuning.json"


def trials_of(search: Search, out: Path) -> list[tuple[str, Trial]]:
    """The search's trials known now, each with its run label: a grid's all, a sampler's those proposed from the results under ``out``."""
    if search.sampler == "grid":
        return [(search.trial_name(trial), trial) for trial in search.trials]
    return proposals(search, Path(out))[0]


def decide(search: Search, out: Path) -> dict | None:
    """The rule applied to the finished trials under ``out``: the adopted settings and every trial; None while one is still to run."""
    if search.sampler == "grid":
        trials = [trial_outcome(search, Path(out), search.trial_name(trial), trial) for trial in search.trials]
        if any(t is None for t in trials):
            return None
    else:
        trials = proposals(search, Path(out))[1]
        if len(trials) < search.n_trials:
            return None
    sign = -1.0 if search.higher_is_better else 1.0
    best = None
    for t in trials:  # the first of the best: a later trial wins only by more than TIE
        if t["qualifies"] and (best is None or sign * t["value"] < sign * best["value"] - search.tie):
            best = t
    return {
        "search": search_table(search),
        "adopted": best["settings"] if best else None,
        "adopted_run": best["run"] if best else None,
        "budget": search.runs,
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


def checked_decision(search: Search, out: Path, recorded: dict) -> dict | None:
    """The decision ``search``'s trials under ``out`` give (None while one is still to run), refused where ``recorded`` (tuning.json) says otherwise."""
    decision = decide(search, out)
    kept = decision_for(search, recorded)
    if decision is not None and kept is not None and _canonical(kept) != _canonical(decision):
        raise ConfigError(
            f"{Path(out) / ADOPTED} records a decision for {search.variant} that its trials' results do not give: "
            "delete it and rerun (the decision is recomputed from the trials)"
        )
    return decision


def decisions(spec_searches: dict[str, Search], out: Path) -> dict:
    """Each search's decision under ``out``, recomputed from its trials and checked against ``OUT/tuning.json``; undecided ones left out."""
    recorded = read_adopted(out)
    made = {variant: checked_decision(search, out, recorded) for variant, search in spec_searches.items()}
    return {variant: decision for variant, decision in made.items() if decision is not None}


def _canonical(decision: dict) -> str:
    """A decision as tuning.json holds it, so one read back compares equal to one computed (tuples and lists alike)."""
    return json.dumps(decision, sort_keys=True)


def read_adopted(out: Path) -> dict:
    """``OUT/tuning.json``: each tuned variant's decision; empty where no search has been decided (read bounded; a damaged one is one line)."""
    fix = "delete it and run the bench again (the decisions are recomputed from the trials' own results)"
    data = read_json(Path(out) / ADOPTED, fix=fix, optional=True)
    return data if isinstance(data, dict) else {}


def write_adopted(out: Path, decisions: dict) -> None:
    """Record the decisions beside the results (sorted keys, so writing them again unchanged changes no byte); never through a link."""
    refuse_links(Path(out), (ADOPTED,))
    write_atomic(Path(out) / ADOPTED, json.dumps(decisions, indent=1, sort_keys=True) + "\n")
