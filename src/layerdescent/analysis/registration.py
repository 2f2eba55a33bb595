"""Machine-checked pre-registration: the plan each run of a bench was made under, recorded by `bench`, checked by `report`.

    record(out, runs, spec)              # bench: before its pending runs train, each gets the current plan's sha256
    plan_status(root, results, spec)     # report: None where nothing was recorded, else whether the plan held

The ledger, ``OUT/.layerdescent-plans.json``, keeps every plan a run was made under by its sha256
and each run's (``VARIANT/seed-N``) hash. The main runs are made under the whole plan (baselines,
declared endpoints, tuning budgets); tuning runs (those evaluated on a split other than test) under
the tuning declaration alone, so a plan may name its endpoints' final settings after tuning without
calling its own tuning runs late.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from layerdescent.analysis.endpoints import BenchSpec, spec_table
from layerdescent.readback import ReadbackError, read_json
from layerdescent.run.files import refuse_links, write_atomic

LEDGER = ".layerdescent-plans.json"


def plan_table(spec: BenchSpec, tuning_run: bool = False) -> dict:
    """What a run is made under: the judging table (less endpoints declared after the runs) for a main run, the tuning budgets alone for a tuning run."""
    table = spec_table(spec)
    if tuning_run:
        return {"tuning": table["tuning"]}
    # an endpoint declared after the runs says so itself: the record of what was fixed before them leaves it out
    plan = {name: e for name, e in table.pop("plan", {}).items() if not e.get("after_runs")}
    return {**table, "plan": plan} if plan else table


def plan_hash(table: dict) -> str:
    """The sha256 of a plan table in canonical JSON (sorted keys), so the same plan always hashes alike."""
    return hashlib.sha256(json.dumps(table, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _read(out: Path) -> dict:
    """The ledger in ``out``, checked: each plan kept under its own sha256, each run naming a kept plan; empty where there is none.

    Read bounded (:mod:`layerdescent.readback`) and never believed: a ledger whose plans do not hash to
    their keys, or whose runs name a plan it does not keep, is one line, not a verdict on forged records.
    """
    fix = "delete it (a report then says no plan was recorded; the next bench run records the current plan)"
    data = read_json(Path(out) / LEDGER, fix=fix, optional=True)
    if data is None:
        return {"plans": {}, "runs": {}}
    plans, runs = (data.get(key) if isinstance(data, dict) else None for key in ("plans", "runs"))
    if not isinstance(plans, dict) or not isinstance(runs, dict):
        raise ReadbackError(f"{Path(out) / LEDGER} is not a plan ledger (plans and runs tables): {fix}")
    forged = next((digest for digest, table in plans.items() if not isinstance(table, dict) or plan_hash(table) != digest), None)
    if forged is not None:
        raise ReadbackError(f"{Path(out) / LEDGER} keeps a plan that does not hash to its key {str(forged)[:12]}: {fix}")
    stray = next((run for run, digest in runs.items() if not isinstance(digest, str) or digest not in plans), None)
    if stray is not None:
        raise ReadbackError(f"{Path(out) / LEDGER} records run {stray!r} under a plan it does not keep: {fix}")
    return data


def record(out: Path, runs: list[tuple[str, bool]], spec: BenchSpec) -> None:
    """Give each of ``runs`` ((``VARIANT/seed-N``, whether it is a tuning run)) not yet in the ledger the current plan's hash."""
    ledger = _read(Path(out))
    new = [(key, tuning) for key, tuning in runs if key not in ledger["runs"]]
    if not new:
        return
    for key, tuning in new:
        table = plan_table(spec, tuning)
        digest = plan_hash(table)
        ledger["plans"][digest] = table
        ledger["runs"][key] = digest
    Path(out).mkdir(parents=True, exist_ok=True)  # before its first run makes it
    refuse_links(Path(out), (LEDGER,))
    write_atomic(Path(out) / LEDGER, json.dumps(ledger, indent=1, sort_keys=True) + "\n")


def _flat(table, prefix: str = "bench") -> dict[str, object]:
    """A nested table as dotted keys (``bench.plan.P1.gamma``) to its values."""
    if not isinstance(table, dict):
        return {prefix: table}
    flat: dict[str, object] = {}
    for key, value in table.items():
        flat.update(_flat(value, f"{prefix}.{key}"))
    return flat


def changes(old: dict, new: dict) -> list[str]:
    """What differs between two plan tables, one phrase per dotted key: "bench.plan.P1.gamma 0.5 -> 1"."""
    before, after = _flat(old), _flat(new)
    said = []
    for key in sorted(set(before) | set(after)):
        if key not in after:
            said.append(f"{key} removed (was {before[key]!r})")
        elif key not in before:
            said.append(f"{key} added ({after[key]!r})")
        elif before[key] != after[key]:
            said.append(f"{key} {before[key]!r} -> {after[key]!r}")
    return said


@dataclass(frozen=True)
class PlanStatus:
    """Whether a bench's runs were all made under the plan it is judged by now."""

    digest: str  # the current plan's sha256
    recorded: int  # runs with a recorded plan
    changed: tuple[str, ...]  # what differs from a plan some run was made under; empty where the plan held

    def line(self) -> str:
        """One sentence for a report: the plan held, or it changed after the runs began (and how)."""
        if not self.changed:
            return f"Plan sha256 {self.digest[:12]}: every one of the {self.recorded} runs with a recorded plan was made under it."
        return (
            f"**Plan changed after the runs began: exploratory.** Plan sha256 {self.digest[:12]} differs from what some of the "
            f"{self.recorded} recorded runs were made under: {'; '.join(self.changed)}."
        )


def plan_status(root: Path, results: list[dict], spec: BenchSpec) -> PlanStatus | None:
    """The plan check of the runs under ``root`` against ``spec``; None where no run has a recorded plan (runs from before records)."""
    ledger = _read(Path(root))
    tables = {tuning: plan_table(spec, tuning) for tuning in (False, True)}  # a main run's plan, a tuning run's
    digests = {tuning: plan_hash(table) for tuning, table in tables.items()}
    changed: dict[str, None] = {}
    recorded = 0
    for r in results:
        key = os.path.relpath(r["run_dir"], root) if "run_dir" in r else None
        digest = ledger["runs"].get(key) if key else None
        if digest is None:
            continue
        recorded += 1
        tuning = r.get("split", "test") != "test"
        if digest != digests[tuning]:
            old = ledger["plans"].get(digest)
            found = changes(old, tables[tuning]) if isinstance(old, dict) else [f"a plan not kept in {LEDGER} (sha256 {digest[:12]})"]
            changed.update(dict.fromkeys(found))
    if not recorded:
        return None
    return PlanStatus(digests[False], recorded, tuple(changed))
