"""Paired differences between any two variants of a bench, at every gamma, on the test split and on each domain.

    layerdescent compare benchmarks/results/llm primal-dual "primal-dual,lens_vocab=all"

A summary pairs each variant with the baselines of its own context; variants whose task settings
differ (two readouts of one solver, say) share no context, and this pairs them directly: A − B
over the seeds both have, with the summary's 95% t interval (**bold** excludes 0).
"""

from __future__ import annotations

from layerdescent.analysis.groups import domain_results
from layerdescent.analysis.paired_differences import cross_code, made_by_label, paired_cell
from layerdescent.errors import LayerdescentError

# Which way each bundled task's metric is better (its torchmetrics class's higher_is_better; a test keeps them
# equal), so that a difference's sign reads as better or worse; a metric not named here is told as higher or lower.
HIGHER_IS_BETTER = {"mse": False, "snr_db": True, "rmse": False, "psnr": True, "accuracy": True, "macro_f1": True, "perplexity": False}


def sign_meaning(metric: str, a: str) -> str:
    """What the sign of A − B means for ``metric``: which sign favours ``a``, where the metric's direction is known."""
    higher = HIGHER_IS_BETTER.get(metric)
    if higher is None:
        return f"positive: {a} higher; which way is better is the metric's own"
    return f"{'higher' if higher else 'lower'} is better: {'positive' if higher else 'negative'} favours {a}"


def pair_tables(results: list[dict], a: str, b: str) -> list[str]:
    """Markdown: per metric, a row per evaluation set and a column per gamma, each cell A − B over paired seeds."""
    labels = list(dict.fromkeys(r["label"] for r in results))
    for label in (a, b):
        if label not in labels:
            raise LayerdescentError(f"no runs labelled {label!r}; the bench's labels are: {', '.join(labels)}")
    if a == b:
        raise LayerdescentError(f"A and B are both {a!r}: a variant minus itself is 0 everywhere; name two different variants")
    seeds = sorted({r["seed"] for r in results if r["label"] == a} & {r["seed"] for r in results if r["label"] == b})
    if not seeds:
        raise LayerdescentError(f"{a!r} and {b!r} share no seed, so nothing can be paired")
    perturbations = {label: sorted({str(r.get("perturbation")) for r in results if r["label"] == label}) for label in (a, b)}
    if perturbations[a] != perturbations[b]:
        raise LayerdescentError(
            f"{a!r} was tested under {' and '.join(perturbations[a])}, {b!r} under {' and '.join(perturbations[b])}: "
            "the same gamma is another noise in each, so their differences mean nothing; compare runs tested under one perturbation"
        )
    depths = {label: sorted({r["num_layers"] for r in results if r["label"] == label}) for label in (a, b)}
    sets = {"test": results, **domain_results(results)}
    value = {
        (r["label"], r["seed"], where, float(g["gamma"]), metric): v
        for where, subset in sets.items()
        for r in subset
        for g in r["gammas"]
        for metric, v in g["metrics"].items()
    }
    gammas = sorted({k[3] for k in value if k[0] in (a, b)})
    metrics = list(dict.fromkeys(k[4] for k in value if k[0] in (a, b)))
    lines = [f"{len(seeds)} paired seeds ({', '.join(map(str, seeds))})."]
    if left := [f"{r['label']} seed {r['seed']}" for r in results if r["label"] in (a, b) and r["seed"] not in seeds]:
        lines.append(f"Left out, with no run of the same seed on the other side: {', '.join(left)}.")
    if depths[a] != depths[b]:
        lines.append(
            f"**{a} has {'/'.join(map(str, depths[a]))} layers, {b} {'/'.join(map(str, depths[b]))}**: each is read at its own last layer."
        )
    if cross_code(made_by_label(results), a, b, seeds):
        lines.append(f"**{a} and {b} were made by different code** (their recorded commits, or the keys their files record, differ).")
    lines.append("")
    for metric in metrics:
        lines += [
            f"## {metric}: {a} − {b} ({sign_meaning(metric, a)})",
            "",
            "| evaluated on | " + " | ".join(f"γ={g:g}" for g in gammas) + " |",
            "|---|" + "---|" * len(gammas),
        ]
        for where in sets:
            lines.append(f"| {where} | " + " | ".join(paired_cell(value, a, b, seeds, where, gamma, metric) for gamma in gammas) + " |")
        lines.append("")
    return lines


def compare_markdown(results: list[dict], a: str, b: str, command: str) -> str:
    """The whole comparison as markdown, saying it was made by ``command``."""
    return "\n".join(
        [
            f"# {a} − {b}",
            "",
            f"Made by `{command}`; each cell is {a} − {b} with its 95% t interval over paired seeds, **bold** excludes 0; "
            f"each table's heading says which sign favours {a}.",
            "",
            *pair_tables(results, a, b),
        ]
    )
