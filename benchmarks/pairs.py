"""Paired differences between any two variants of a bench: the script that made benchmarks/results/llm/readouts.md.

    python benchmarks/pairs.py benchmarks/results/llm primal-dual "primal-dual,lens_vocab=all" \
        --out benchmarks/results/llm/readouts.md

A thin wrapper of `layerdescent compare` (``layerdescent.analysis.compare``), kept so that the command
readouts.md names still makes it; new comparisons use `layerdescent compare RUNS A B`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from layerdescent.analysis.compare import compare_markdown
from layerdescent.analysis.report import collect
from layerdescent.errors import LayerdescentError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path, help="a bench directory (every results.json under it)")
    parser.add_argument("a", help="the variant label compared")
    parser.add_argument("b", help="the variant label it is compared with")
    parser.add_argument("--out", type=Path, help="where to write the markdown (default: print it)")
    args = parser.parse_args(argv)
    command = " ".join(
        shlex.quote(part)
        for part in [
            "python",
            "benchmarks/pairs.py",
            *map(str, [args.bench, args.a, args.b]),
            *(["--out", str(args.out)] if args.out else []),
        ]
    )
    try:
        text = compare_markdown(collect(args.bench), args.a, args.b, command)
    except LayerdescentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
