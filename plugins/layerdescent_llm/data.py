"""LLM finetuning data: review sentiment as an instruction, and plain text cut into token windows."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import layerdescent

if TYPE_CHECKING:  # datasets loads when windows are cut, not when the task registers
    import datasets

PROMPT = ("Review:", "\nSentiment:")  # before and after the review text
LABEL_WORDS = (" negative", " positive")  # label 0, label 1


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
    import datasets

    windows = []
    for ids in tokenizer(documents, add_special_tokens=False)["input_ids"]:
        windows += [ids[i : i + length] for i in range(0, len(ids), length) if len(ids[i : i + length]) >= 2]
    return datasets.Dataset.from_dict({"input_ids": windows})
