"""The per-layer readout's extra memory in one training step of SmolLM2 with LoRA, for the label lens and the whole-vocabulary lens.

    layerdescent assets fetch smollm2 vader
    python benchmarks/readout_memory.py --out benchmarks/results/llm/readout_memory.md

The model, LoRA, batch size, sequence length and training perturbation are benchmarks/llm.toml's
(SmolLM2-135M-Instruct, 30 layers, LoRA rank 8 on q/v, batch 8 of the movie-review instruction,
max_length 64, gamma 0.1, one thread). The label lens is its task (``lens_vocab = "labels"``);
the whole-vocabulary lens is its variant ``primal-dual,lens_vocab=all``, whose task is
benchmarks/llm_vocab64.toml's too (that file differs only in split sizes). "Layers read out" is
how many hidden states besides the last are read to a loss: 0 is the last alone (the model's own
loss, what erm's training steps read), m > 0 is ``lens_layers = "last-m"`` with ``lens_last = m``
(the embeddings and the last m - 1 transformer layers, besides the last), and 30 is every layer.

One step is the task's ``layer_losses`` on one fixed batch (the same 8 training sentences for
every configuration), the sum of the layer means (the primal loss of deep supervision; a
Lagrangian weights the same means, so its autograd graph is the same), backward, and an AdamW
step on the adapters. Every configuration runs in a fresh process (a warm-up step, then the
measured ones), so no allocator state carries over. Three measures, each named in the table:

- saved for backward: the bytes of the tensors autograd saves during the forward pass
  (``torch.autograd.graph.saved_tensors_hooks``), counted once per storage, parameters and
  buffers left out. Deterministic: what the readout keeps alive until backward.
- peak allocated: the most bytes allocated during the step and live at once, from the
  allocation events of ``torch.profiler`` (``profile_memory=True``), forward, backward and
  optimizer step. Deterministic on one thread; the step's transient buffers (a vocabulary
  chunk's logits, say) count here and not above.
- peak RSS rise: the rise of the process's resident set during the step (Linux VmHWM, reset
  after returning freed memory to the system, as in benchmarks/cost.py), median over
  ``--repeats`` steps: what the machine sees. Each process runs with glibc's mmap threshold fixed
  at 128 KiB (``MALLOC_MMAP_THRESHOLD_``), so large blocks go back to the system when freed; with
  the default, which moves as blocks are freed, the rise of one configuration varied by 70 MiB
  from process to process, more than the whole readout.

The last table fits a line to each measure over the counts above 0: its slope is the extra memory
of one more transformer layer read out. Count 1 reads the embeddings, which under LoRA carry no
gradient (the embedding table is frozen), so their readout costs its forward pass alone; every
count above it adds transformer layers. The header gives the size of one hidden state of the
batch in float32 (B x T x H x 4 bytes), the gradient a read layer's readout hands back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

import tomllib

HERE = Path(__file__).parent
LENSES = {"labels": "label lens", "all": "whole-vocabulary lens"}
MIB = 2**20


def build(lens: str, count: int, out: Path):
    """The task, its LoRA model and one fixed training batch of benchmarks/llm.toml, reading ``count`` states besides the last through ``lens``."""
    import torch

    import layerdescent as ld
    from layerdescent.run.trainer import Trainer

    table = tomllib.loads((HERE / "llm.toml").read_text())
    table = {key: table[key] for key in ("seed", "task", "train", "solver", "constraints")}
    table["task"] = {**table["task"], "lens_vocab": lens, "train_size": 64, "validation_size": 8, "test_size": 8}
    if count:
        table["task"].update(lens_layers="last-m", lens_last=count)
    table["train"] = {**table["train"], "progress": False}
    run = Trainer(ld.config_from_dict(table), out)
    session = run.setup()
    rows = session.rows["train"]
    idx = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))[: run.config.train.batch_size]
    return run.task, session.model, run.task.collate(rows[idx]), run.config.train


def child(lens: str, count: int, repeats: int) -> dict:
    """Measure one configuration in this process: saved-for-backward bytes, profiler peak allocated bytes, median peak RSS rise."""
    import torch
    from cost import StepMemory
    from torch.profiler import ProfilerActivity, profile

    with tempfile.TemporaryDirectory() as tmp:
        task, model, batch, train = build(lens, count, Path(tmp) / "run")
    read = task.last_layer_losses if count == 0 else task.layer_losses
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=train.lr)
    owned = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in owned:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    def step(hooks: bool = False) -> None:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if hooks else nullcontext():
            losses = read(model, batch, train.train_gamma).losses
        losses.mean(0).sum().backward()
        optimizer.step()

    optimizer.zero_grad(set_to_none=True)
    step(hooks=True)  # the warm-up step also counts the saved tensors: they are the same in every step
    rss, memory = [], StepMemory()
    for _ in range(repeats):
        optimizer.zero_grad(set_to_none=True)
        memory.start()
        step()
        rss.append(memory.peak())
    optimizer.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = []

    def walk(event) -> None:
        if type(event.extra_fields).__name__ == "_ExtraFields_Allocation":
            events.append((event.start_time_ns, event.extra_fields.alloc_size))
        for inner in event.children:
            walk(inner)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return {
        "states": task.num_layers + 1 if count else 1,
        "tokens": list(batch["input_ids"].shape),
        "hidden": batch["input_ids"].numel() * model.lm.config.hidden_size * 4 / MIB,
        "saved": sum(saved.values()) / MIB,
        "allocated": peak / MIB,
        "rss": statistics.median(rss),
    }


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys on xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--counts", default="0,1,4,16,30", help="layers read out besides the last, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="steps whose peak RSS rise is measured, per configuration")
    parser.add_argument("--lenses", default="labels,all")
    parser.add_argument("--child", nargs=2, metavar=("LENS", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.repeats)))
        return
    counts, lenses = [int(c) for c in args.counts.split(",")], args.lenses.split(",")
    command = f"python benchmarks/readout_memory.py --out {args.out} --counts {args.counts} --repeats {args.repeats} --lenses {args.lenses}"
    results: dict[str, dict[int, dict]] = {lens: {} for lens in lenses}
    for lens in lenses:
        for count in counts:
            script = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--out",
                str(args.out),
                "--repeats",
                str(args.repeats),
                "--child",
                lens,
                str(count),
            ]
            env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
            done = subprocess.run(script, capture_output=True, text=True, cwd=HERE.parent, env=env)
            if done.returncode:
                sys.exit(f"{lens} lens, {count} layers read out failed:\n{done.stderr}")
            results[lens][count] = json.loads(done.stdout.strip().splitlines()[-1])
            print(lens, count, results[lens][count], flush=True)
    import torch

    first = next(iter(results[lenses[0]].values()))
    shape = first["tokens"]
    fitted = [c for c in counts if c > 0] if sum(c > 0 for c in counts) >= 2 else counts
    measures = (("saved", "saved for backward"), ("allocated", "peak allocated"), ("rss", f"peak RSS rise (median of {args.repeats})"))
    lines = [
        "# The readout's extra memory per layer: SmolLM2-135M, LoRA, one training step",
        "",
        f"    {command}",
        "",
        f"benchmarks/llm.toml's model and training (LoRA rank 8 on q/v, batch {shape[0]} x {shape[1]} tokens, gamma 0.1, 1 thread); "
        f"torch {torch.__version__}, {platform.machine()}. Each configuration in a fresh process; methods in the script's docstring. "
        f"One hidden state of this batch in float32: {first['hidden']:.3f} MiB. "
        "Layers read out: hidden states read to a loss besides the last (0: the last alone; 1: the embeddings; m: the embeddings and the m - 1 transformer layers below the last; 30: every layer). "
        '"+" columns: the rise over 0 layers read out with the same lens. MiB.',
        "",
        "| lens | layers read out | " + " | ".join(f"{title} | +" for _, title in measures) + " |",
        "|---|---:|" + "---:|---:|" * len(measures),
    ]
    for lens in lenses:
        base = results[lens][min(counts)]
        for count in counts:
            r = results[lens][count]
            lines.append(
                f"| {LENSES[lens]} | {count} | " + " | ".join(f"{r[key]:.2f} | {r[key] - base[key]:+.2f}" for key, _ in measures) + " |"
            )
    lines += [
        "",
        f"Per transformer layer read out: the least-squares slope over the counts {', '.join(map(str, fitted))} (MiB per layer, and KiB), "
        "and the whole readout (every layer against the last alone) as a share of the step.",
        "",
        "| lens | " + " | ".join(f"{title}: per layer | every layer, % of last alone" for _, title in measures) + " |",
        "|---|" + "---:|---:|" * len(measures),
    ]
    for lens in lenses:
        cells = []
        for key, _ in measures:
            per_layer = slope(fitted, [results[lens][c][key] for c in fitted])
            base, top = results[lens][min(counts)][key], results[lens][max(counts)][key]
            cells.append(f"{per_layer:.3f} ({per_layer * 1024:.0f} KiB) | {100 * (top - base) / base:+.1f}%")
        lines.append(f"| {LENSES[lens]} | " + " | ".join(cells) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
