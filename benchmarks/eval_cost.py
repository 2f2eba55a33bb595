"""What the final evaluation costs against its floor, before and after issue 35, in one process.

    layerdescent assets fetch minilm vader
    python benchmarks/eval_cost.py --setting text_paper --rows 256 --domain-rows 128 --out benchmarks/results/text_paper/eval_cost.md
    layerdescent assets fetch smollm2 vader
    python benchmarks/eval_cost.py --setting llm --rows 128 --domain-rows 64 --out benchmarks/results/llm/eval_cost.md

The model is the setting's (``benchmarks/SETTING.toml``, its top-level config: primal-dual, seed 0)
as built before training: evaluation costs the same whatever the weights. Its evaluation runs on
a subset (``--rows`` of the test split, ``--domain-rows`` of each domain) at the setting's own
gammas, domains and eval batch size. Three ways take turns in every round, in an order rotated
each round so that machine noise and warm-up hit them alike; round 0 warms up and is dropped:

- before: the evaluation as it ran before issue 35 (``torch.no_grad``, one pass per set over
  every gamma, nothing saved between records);
- after: ``evaluate_all`` as the trainer calls it now (``torch.inference_mode``, each
  (gamma, set) record saved to a run directory's evaluation.partial.json as it is taken);
- floor: a bare ``torch.inference_mode`` loop of the same backbone's forward passes (the
  encoder, or the causal LM's base model, without hidden states collected, perturbation, readout
  or metrics) over the same inputs at the same batch size, collated beforehand: the forward
  passes the evaluation cannot skip.

The table gives medians over rounds and, as ratios, the median over rounds of (way / floor)
within a round. Before and after must give identical records (checked every round). The last
table scales the measured cost per forward row to the full evaluation of one committed run of
the setting (its results.json workload) beside that run's training time (steps x median step).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import layerdescent as ld
from layerdescent.run import rundir
from layerdescent.run.data import Rows
from layerdescent.run.evaluator import domain_rows, evaluate, evaluate_all
from layerdescent.run.trainer import Trainer

HERE = Path(__file__).parent
# One committed run per setting (seed 0): its workload and training time set the full-run estimate.
RUNS = {"text_paper": "primal-dual,train_gamma=0.8", "llm": "primal-dual"}


def subset(rows: Rows, n: int) -> Rows:
    """The first ``n`` rows of ``rows`` (all when n is 0 or more than it holds)."""
    n = min(n or len(rows), len(rows))
    out = Rows.__new__(Rows)
    out.columns = {name: column[:n] for name, column in rows.columns.items()}
    out.length = n
    return out


def backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The pretrained network inside a task's model: the text encoder, or the causal LM's base model."""
    return model.encoder if hasattr(model, "encoder") else model.lm.base_model


def before(task, model, rows: Rows, config) -> dict:
    """The evaluation as it ran before issue 35: no_grad, one evaluate() per set over every gamma."""
    plain = evaluate.__wrapped__  # the function under inference_mode's decorator
    with torch.no_grad():
        out = {"gammas": plain(task, model, rows, config.gammas, config.batch_size, config.seed)}
        if config.domains:
            out["domains"] = {
                name: plain(
                    task, model, domain_rows(task, name, config.domain_samples, config.seed), config.gammas, config.batch_size, config.seed
                )
                for name in config.domains
            }
    return out


def after(task, model, rows: Rows, config, run_dir: Path) -> dict:
    """evaluate_all as the trainer runs it, each record saved under a key as the trainer saves it."""
    key = {"step": 0, "epoch": 0, "eval": {"gammas": list(config.gammas)}}
    out = evaluate_all(
        task, model, rows, config, done=None, on_record=lambda partial: rundir.save_partial_evaluation(run_dir, key, partial)
    )
    return {k: v for k, v in out.items() if k in ("gammas", "domains")}


def floor_batches(task, rows: Rows, config) -> list[dict]:
    """Every forward pass's inputs, collated beforehand: each set's batches, once per gamma."""
    sets = [rows, *(domain_rows(task, name, config.domain_samples, config.seed) for name in config.domains)]
    out = []
    for dataset in sets:
        batches = [task.collate(dataset[start : start + config.batch_size]) for start in range(0, len(dataset), config.batch_size)]
        out += [{"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]} for b in batches] * len(config.gammas)
    return out


def floor(model: torch.nn.Module, batches: list[dict]) -> None:
    """The forward passes alone."""
    net = backbone(model)
    model.eval()  # as evaluate() does: no dropout
    with torch.inference_mode():
        for batch in batches:
            net(**batch)


def full_run(setting: str) -> dict | None:
    """The committed run's evaluation workload and training time, or None when it is not there."""
    path = HERE / "results" / setting / RUNS[setting] / "seed-0" / "results.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    sets = [data["gammas"], *data.get("domains", {}).values()]
    forward_rows = sum(records[0].get("samples", 0) * len(records) for records in sets)
    return {
        "path": path,
        "forward_rows": forward_rows,
        "train_s": data["train"]["steps"] * data["train"]["step_time_median"],
        "steps": data["train"]["steps"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=sorted(RUNS), required=True)
    parser.add_argument("--rows", type=int, default=128, help="test rows evaluated (0: all)")
    parser.add_argument("--domain-rows", type=int, default=64, help="rows of each domain (eval.domain_samples)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, the first a warm-up")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)

    overrides = [f"eval.domain_samples={args.domain_rows}"]
    config = ld.load_config(HERE / f"{args.setting}.toml", overrides)
    trainer = Trainer(config, tempfile.mkdtemp())
    session = trainer.setup()
    task, model, ev = trainer.task, session.model, config.eval
    rows = subset(session.rows[ev.split], args.rows)
    batches = floor_batches(task, rows, ev)
    forward_rows = sum(len(b["input_ids"]) for b in batches)
    ways = {
        "before": lambda: before(task, model, rows, ev),
        "after": lambda: after(task, model, rows, ev, Path(tempfile.mkdtemp())),
        "floor": lambda: floor(model, batches),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    identical = True
    for r in range(args.rounds):
        order = list(ways)[r % 3 :] + list(ways)[: r % 3]
        got = {}
        for name in order:
            start = time.perf_counter()
            got[name] = ways[name]()
            times[name].append(time.perf_counter() - start)
            print(f"round {r} {name}: {times[name][-1]:.2f} s", file=sys.stderr, flush=True)
        identical = identical and got["before"] == got["after"]
    kept = {name: values[1:] for name, values in times.items()}  # round 0 warms up
    ratio = {name: statistics.median(t / f for t, f in zip(kept[name], kept["floor"])) for name in ways}
    median = {name: statistics.median(values) for name, values in kept.items()}

    sets = 1 + len(ev.domains)
    lines = [
        f"# Evaluation cost against its forward-pass floor: {args.setting}",
        "",
        f"    python benchmarks/eval_cost.py --setting {args.setting} --rows {args.rows} --domain-rows {args.domain_rows} --rounds {args.rounds} --out {args.out}",
        "",
        f"Model: the setting's ({args.setting}.toml, {task.name}, {task.num_layers} layers), as built before training. "
        f"Workload here: {len(rows)} {ev.split} rows + {len(ev.domains)} domains x {args.domain_rows} rows, at {len(ev.gammas)} gammas "
        f"({len(ev.gammas) * sets} records, {forward_rows} rows passed forward in {len(batches)} batches of at most {ev.batch_size}). "
        f"torch {torch.__version__}, 1 thread, {platform.processor() or platform.machine()}; {args.rounds - 1} measured rounds after a warm-up, interleaved. "
        f"Before and after gave identical records in every round: {'yes' if identical else 'NO'}.",
        "",
        "| way | median s | per forward row, ms | / floor (median of per-round ratios) |",
        "|---|---:|---:|---:|",
    ]
    for name in ways:
        lines.append(f"| {name} | {median[name]:.2f} | {1000 * median[name] / forward_rows:.2f} | {ratio[name]:.3f} |")
    run = full_run(args.setting)
    if run:
        per_row = {name: median[name] / forward_rows for name in ways}
        floor_s = per_row["floor"] * run["forward_rows"]
        after_s = per_row["after"] * run["forward_rows"]
        lines += [
            "",
            f"A full run of the setting, scaled from the cost per forward row above to the workload of {run['path'].relative_to(HERE.parent)} "
            f"({run['forward_rows']} rows forward), beside its training ({run['steps']} steps x median step, from the same file):",
            "",
            "| | minutes |",
            "|---|---:|",
            f"| training | {run['train_s'] / 60:.1f} |",
            f"| evaluation, before | {per_row['before'] * run['forward_rows'] / 60:.1f} |",
            f"| evaluation, after | {after_s / 60:.1f} |",
            f"| forward-pass floor | {floor_s / 60:.1f} |",
            "",
            f"The floor is {floor_s / after_s:.0%} of the evaluation after, and the evaluation after is {after_s / (after_s + run['train_s']):.0%} of training plus evaluation.",
        ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not identical:
        raise SystemExit("before and after gave different records")


if __name__ == "__main__":
    main()
