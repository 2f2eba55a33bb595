"""What a run directory holds: the names of the files a run writes, and which of them mark a run."""

from __future__ import annotations

LOCK = ".layerdescent.lock"  # also marks the directory as a run's, even before its first checkpoint
EVALUATION_PARTIAL = "evaluation.partial.json"  # the records an evaluation has taken so far, so an interrupted one resumes at the next
FAILURE = "failure.json"  # how a run that failed while training or in its final evaluation ended, until it trains again (`bench --status` reads it)
WRITES = (
    "config.toml",
    "metrics.jsonl",
    "checkpoint.pt",
    "checkpoint.prev.pt",
    "best.pt",
    "results.json",
    "model.safetensors",
    EVALUATION_PARTIAL,
    FAILURE,
)
# A directory holding one of these is a run, lock file or not (older runs; a failed run copied or committed without it).
FINISHED = ("checkpoint.pt", "results.json", FAILURE)
# How a run executes, not what it computes: a finished run is the same run whatever these say.
EXECUTION_KEYS = ("train.threads", "train.progress", "train.keep_checkpoint", "train.checkpoint_every", "train.trackers")


TRACKER_STORES = ("mlruns",)  # the default MLflow store keeps a copy of each results.json as an artifact
MODEL_FILE = "model.safetensors"  # the final (evaluated) model of a finished run
