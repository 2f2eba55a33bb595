"""Text classification data: human-rated movie-review sentences, and a synthetic fallback."""

from __future__ import annotations

import random

import datasets
from sklearn.model_selection import train_test_split

from layerdescent import Asset
from layerdescent.assets import extract, extract_from_file

VADER = Asset(
    name="vader",
    source="pypi-sdist",
    requirement="vadersentiment==3.3.2",
    filename="vaderSentiment-3.3.2.tar.gz",
    sha256="5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9",
    description="10,605 Rotten Tomatoes sentences with mean human ratings (Hutto & Gilbert 2014)",
)
REVIEWS_ARCHIVE = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
REVIEWS_FILE = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"


def movie_review_rows() -> dict[str, list]:
    """Sentences labelled by the sign of their mean rating (1 positive), exact zeros dropped."""
    archive = extract(VADER, REVIEWS_ARCHIVE)
    path = extract_from_file(archive, REVIEWS_FILE, archive.parent / "hutto_ICWSM_2014")
    texts, labels = [], []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        parts = line.split("\t", 2)
        if len(parts) != 3:
            continue
        rating = float(parts[1])
        if rating != 0:
            texts.append(parts[2].strip())
            labels.append(int(rating > 0))
    return {"text": texts, "label": labels}


POSITIVE = ["great", "wonderful", "moving", "brilliant", "funny", "charming", "superb", "delightful"]
NEGATIVE = ["awful", "boring", "dull", "terrible", "clumsy", "tedious", "bland", "painful"]
FILLER = ["the", "film", "movie", "story", "acting", "plot", "was", "is", "and", "a", "with", "its", "cast", "script", "ending", "really", "quite", "at", "times"]


def synthetic_rows(size: int, seed: int) -> dict[str, list]:
    """Keyword sentiment: filler words around one to three words of the label's polarity."""
    rng = random.Random(seed)
    texts, labels = [], []
    for i in range(size):
        label = i % 2
        words = [rng.choice(FILLER) for _ in range(rng.randint(4, 10))]
        for _ in range(rng.randint(1, 3)):
            words.insert(rng.randrange(len(words) + 1), rng.choice(POSITIVE if label else NEGATIVE))
        texts.append(" ".join(words))
        labels.append(label)
    return {"text": texts, "label": labels}


def split(rows: dict[str, list], seed: int, validation: float = 0.1, test: float = 0.1) -> dict[str, datasets.Dataset]:
    """Stratified train / validation / test splits, the same for a given seed."""
    index = list(range(len(rows["label"])))
    rest, test_index = train_test_split(index, test_size=test, stratify=rows["label"], random_state=seed)
    rest_labels = [rows["label"][i] for i in rest]
    train_index, val_index = train_test_split(rest, test_size=validation / (1 - test), stratify=rest_labels, random_state=seed)

    def take(indices: list[int]) -> datasets.Dataset:
        return datasets.Dataset.from_dict({k: [v[i] for i in indices] for k, v in rows.items()})

    return {"train": take(train_index), "validation": take(val_index), "test": take(test_index)}
