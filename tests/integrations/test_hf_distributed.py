"""DescentTrainer under torchrun: 2 CPU processes with gloo follow one process, with gradient accumulation, and resume across process counts."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
from conftest import LEAVE_TOGETHER, run_script

pytestmark = [
    pytest.mark.skipif(
        not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
        reason="torch.distributed with gloo is not available",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
        reason="the Trainer integration needs transformers and accelerate (pip install 'layerdescent[hf]')",
    ),
]

GLOBAL_BATCH = 8  # per optimizer micro-step, over all processes
STEPS = 4

# Trains a tiny BERT (no dropout: ranks would draw different masks) with DescentTrainer at a global
# batch of GLOBAL_BATCH x accumulate; writes each step's multipliers and the logged layer losses.
RUNNER = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import transformers
    import layerdescent as ld

    torch.set_num_threads(1)
    out, accumulate, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=16, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertForSequenceClassification(config)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 32, (64, 6), generator=g)
    rows = [{"input_ids": x, "attention_mask": torch.ones(6, dtype=torch.long), "labels": int(x[1] >= 16)} for x in ids]

    def readout(hidden, inputs):
        return torch.nn.functional.cross_entropy(model.classifier(hidden[:, 0]), inputs["labels"], reduction="none")

    args = transformers.TrainingArguments(
        os.path.join(out, "out"), max_steps=%(steps)d, per_device_train_batch_size=%(batch)d // world, gradient_accumulation_steps=accumulate,
        learning_rate=1e-2, logging_steps=1, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="steps", save_steps=2, seed=0,
        ddp_backend="gloo" if world > 1 else None,
    )
    trainer = ld.DescentTrainer(model=model, args=args, train_dataset=rows, constraints=[ld.Descent(alpha=0.5)], readout=readout, dual_lr=1.0)
    history = {}

    class Record(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            history[state.global_step] = trainer.update.multipliers()["descent"].tolist()

    trainer.add_callback(Record())
    trainer.train(resume_from_checkpoint=None if resume == "fresh" else os.path.join(out, "out", resume))
    losses = {line["step"]: [line[f"train/loss/l{k}"] for k in range(4)] for line in trainer.state.log_history if "train/loss/l0" in line}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump({"lambda": history, "layer_loss": losses}, handle)
    %(leave)s
    """
) % {"steps": STEPS, "batch": GLOBAL_BATCH, "leave": LEAVE_TOGETHER}


def launch(out, nproc: int, accumulate: int = 2, resume: str = "fresh") -> dict:
    """Run RUNNER in ``nproc`` processes into ``out``; rank 0's record (and rank 1's under "rank1")."""
    record, *others = run_script(RUNNER, out, nproc, str(accumulate), resume)
    if others:
        record["rank1"] = others[0]
    return record


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same global batch (8 x 2 accumulated micro-batches): in one process, and in 2 of 4 rows each."""
    tmp = tmp_path_factory.mktemp("hf_dist")
    return {"tmp": tmp, "one": launch(tmp / "one", 1), "two": launch(tmp / "two", 2)}


def _tensor(table: dict) -> torch.Tensor:
    return torch.tensor([table[step] for step in sorted(table, key=int)])


def test_two_processes_step_the_multipliers_of_one_with_gradient_accumulation(runs):
    one, two = runs["one"], runs["two"]
    assert sorted(one["lambda"], key=int) == [str(s) for s in range(1, STEPS + 1)]
    assert float(_tensor(one["lambda"])[-1].max()) > 0, "the constraints never became active"
    torch.testing.assert_close(_tensor(two["lambda"]), _tensor(one["lambda"]), rtol=1e-4, atol=1e-6)


def test_two_processes_log_the_layer_losses_of_one(runs):
    one, two = runs["one"], runs["two"]
    assert len(one["layer_loss"]) == STEPS
    torch.testing.assert_close(_tensor(two["layer_loss"]), _tensor(one["layer_loss"]), rtol=1e-4, atol=1e-6)


def test_every_process_holds_the_same_multipliers(runs):
    assert runs["two"]["lambda"] == runs["two"]["rank1"]["lambda"]


def test_a_checkpoint_of_two_processes_resumes_in_one_on_the_same_trajectory(runs):
    tmp = runs["tmp"]
    resumed = launch(tmp / "two", 1, resume="checkpoint-2")
    later = {step: values for step, values in runs["one"]["lambda"].items() if int(step) > 2}
    assert sorted(resumed["lambda"], key=int) == sorted(later, key=int)
    torch.testing.assert_close(_tensor(resumed["lambda"]), _tensor(later), rtol=1e-4, atol=1e-6)


def test_a_checkpoint_of_one_process_resumes_in_two_on_the_same_trajectory(runs):
    tmp = runs["tmp"]
    resumed = launch(tmp / "one", 2, resume="checkpoint-2")
    later = {step: values for step, values in runs["one"]["lambda"].items() if int(step) > 2}
    torch.testing.assert_close(_tensor(resumed["lambda"]), _tensor(later), rtol=1e-4, atol=1e-6)
    after = {
        kind: {s: v for s, v in table.items() if int(s) > 2}
        for kind, table in (("resumed", resumed["layer_loss"]), ("whole", runs["one"]["layer_loss"]))
    }
    assert len(after["resumed"]) == 2  # the log before the checkpoint comes back with it
    torch.testing.assert_close(_tensor(after["resumed"]), _tensor(after["whole"]), rtol=1e-4, atol=1e-6)
