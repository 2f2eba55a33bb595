"""The path one training step takes through the project's files: which files, in what order, and how often it returns to one.

    python benchmarks/step_path.py                       # primal-dual (simultaneous) on a small lista
    python benchmarks/step_path.py --solver erm --show   # and print the whole path
    python benchmarks/step_path.py --all --show          # every built-in solver and scheme (benchmarks/results/lista/step_path.md)

A profiler follows one ``Trainer.step`` after a warm-up step. Each moment is placed in the
innermost frame that belongs to the project's core (``src/layerdescent``) or to Cooper; torch,
the standard library and the task plugin are transparent (their time counts to the core file
that called them). The path is the sequence of files with repeats collapsed; a *return* is a
file appearing again after the path left it. A second count leaves out the task's forward pass
(``guard.py``, which calls the task's methods, ``task.py``, ``data.py`` and ``prox.py``, the task's
helpers): what a reader follows through the update, the solver and Cooper. A third leaves out
Cooper's frames too: the project's own files, Cooper counted as the library call torch's are.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

import layerdescent as ld
from layerdescent.run.trainer import Trainer

CORE = Path(ld.__file__).resolve().parent
TASK_SIDE = {"guard.py", "task.py", "data.py", "prox.py"}  # the forward pass through the task and its helpers


def place(filename: str) -> str | None:
    """The path entry a frame of ``filename`` belongs to, or None when it is transparent."""
    path = Path(filename)
    if "cooper" in path.parts and "site-packages" in path.parts:
        return "cooper"
    try:
        return str(path.resolve().relative_to(CORE))
    except ValueError:
        return None


def trace(call) -> list[str]:
    """The collapsed sequence of files ``call()`` runs through."""
    path: list[str] = []
    cache: dict[str, str | None] = {}

    def where(frame) -> str | None:
        while frame is not None:
            name = frame.f_code.co_filename
            if name not in cache:
                cache[name] = place(name)
            if cache[name] is not None:
                return cache[name]
            frame = frame.f_back
        return None

    def profile(frame, event, arg) -> None:
        here = where(frame.f_back) if event == "return" else where(frame)  # after a return, the caller runs
        if here is not None and (not path or path[-1] != here):
            path.append(here)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return path


VARIANTS = {  # --all: every built-in solver, and each scheme of primal-dual
    "erm": ("erm", ""),
    "penalty": ("penalty", ""),
    "primal-dual": ("primal-dual", ""),
    "primal-dual alternating": ("primal-dual", "alternating"),
    "primal-dual alternating-primal-dual": ("primal-dual", "alternating-primal-dual"),
    "primal-dual extrapolation": ("primal-dual", "extrapolation"),
}


def step_path(solver_name: str, scheme: str) -> list[str]:
    """The collapsed path of one ``Trainer.step`` of ``solver_name`` (and ``scheme``) on a small lista, after a warm-up step."""
    torch.set_num_threads(1)
    solver = {"name": solver_name, **({"scheme": scheme} if scheme else {})}
    table = {
        "task": {
            "name": "lista",
            "layers": 4,
            "code_dim": 16,
            "measure_dim": 12,
            "sparsity": 2,
            "train_size": 256,
            "validation_size": 64,
            "test_size": 64,
        },
        "train": {"epochs": 1, "batch_size": 64, "progress": False, **({"optimizer": "adam"} if scheme == "extrapolation" else {})},
        "solver": solver,
        "constraints": [{"kind": "descent", "alpha": 0.05}],
    }
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(ld.config_from_dict(table), Path(tmp) / "run")
        session = trainer.setup()
        batches = torch.arange(256).split(64)
        trainer.step(session, [batches[0]], 0)  # warm-up: anchors, lazy imports
        path = trace(lambda: trainer.step(session, [batches[1]], 1))
    if path and path[0] != "run/trainer.py":  # the step begins in the trainer, whose frame the trace starts inside
        path.insert(0, "run/trainer.py")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solver", default="primal-dual")
    parser.add_argument("--scheme", default="")
    parser.add_argument("--all", action="store_true", help="every built-in solver and scheme, one after another")
    parser.add_argument("--show", action="store_true", help="print the whole path")
    args = parser.parse_args()
    variants = VARIANTS if args.all else {f"{args.solver}{' ' + args.scheme if args.scheme else ''}": (args.solver, args.scheme)}
    for title, (solver_name, scheme) in variants.items():
        path = step_path(solver_name, scheme)
        report(title, path, args.show)
        solver_side = collapsed([name for name in path if Path(name).name not in TASK_SIDE])
        report(f"{title}, without the task's forward pass", solver_side, args.show)
        # the project's own files alone: each call into Cooper then counts as a library call, as torch's do
        report(f"{title}, without the task's forward pass or Cooper", collapsed([n for n in solver_side if n != "cooper"]), args.show)


def collapsed(path: list[str]) -> list[str]:
    """``path`` with each run of one file kept once."""
    return [name for i, name in enumerate(path) if i == 0 or path[i - 1] != name]


def report(title: str, path: list[str], show: bool) -> None:
    """Print the files a path visits, in order, and how often it returns to each."""
    visits = Counter(path)
    returns = {name: count - 1 for name, count in visits.items() if count > 1}
    print(f"{title}: {len(visits)} files, {len(path)} segments, {sum(returns.values())} returns")
    print("  files in order of first visit: " + " -> ".join(dict.fromkeys(path)))
    print("  returns per file: " + ", ".join(f"{name} {count}" for name, count in sorted(returns.items(), key=lambda kv: -kv[1])))
    if show:
        print("  " + " -> ".join(path))


if __name__ == "__main__":
    main()
