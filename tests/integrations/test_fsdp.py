"""A model sharded with FSDP (torch's ``fully_shard``) trains under the descent constraints as the unsharded model does.

On CPU processes (gloo) through ``LayerwiseUpdate`` in a loop of one's own; through
``DescentTrainer`` (the Trainer's ``fsdp`` option) only where CUDA is present, because accelerate
runs multi-CPU training as DDP whatever ``fsdp`` says.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
from conftest import LEAVE_TOGETHER, run_script

needs_gloo = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is not available",
)
needs_hf = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
    reason="these runs use a transformers model (pip install 'layerdescent[hf]')",
)
pytestmark = [needs_gloo, needs_hf]

STEPS, ACCUMULATE, BATCH = 4, 2, 8  # BATCH: one micro-batch, over all processes

# Each script's start: its arguments (out folder, layout), this process's place, and the same tiny BERT
# (no dropout: ranks would draw different masks).
PREAMBLE = """
import json, os, sys
import torch
import transformers
import layerdescent as ld

out, layout = sys.argv[1], sys.argv[2]
world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
torch.manual_seed(0)
config = transformers.BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
                                 max_position_embeddings=16, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
model = transformers.BertForSequenceClassification(config)
"""

# What the scripts below are filled in with: their start and end, and the run's sizes.
SIZES = {
    "preamble": PREAMBLE,
    "leave": LEAVE_TOGETHER,
    "steps": STEPS,
    "accumulate": ACCUMULATE,
    "batch": BATCH,
    "rows": STEPS * ACCUMULATE * BATCH,
}

# The tiny BERT in the loop docs/own-loop.md shows;
# the readout calls model.classifier outside the model's forward pass, the case FSDP could leave sharded.
# argv: out folder, layout ("plain": no FSDP; "layers": each encoder layer and the root sharded;
# "head": the classifier its own unit too).
OWN_LOOP = (
    textwrap.dedent(
        """
    %(preamble)s
    import torch.nn.functional as F

    torch.set_num_threads(1)
    if layout != "plain":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        torch.distributed.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (world,))
        for layer in model.bert.encoder.layer:
            fully_shard(layer, mesh=mesh)
        if layout == "head":
            fully_shard(model.classifier, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    update = ld.LayerwiseUpdate([ld.Descent(alpha=0.5)], num_layers=3, optimizer=optimizer, dual_lr=1.0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 32, (%(rows)d, 6), generator=g)
    labels = (ids[:, 1] >= 16).long()
    record = {"lambda": [], "means": [], "shard": list(model.bert.encoder.layer[0].output.dense.weight.to_local().shape)
              if layout != "plain" else None}
    for step in range(%(steps)d):
        update.zero_grad()
        for micro in range(%(accumulate)d):
            start = (step * %(accumulate)d + micro) * %(batch)d
            rows = torch.arange(start, start + %(batch)d).tensor_split(world)[rank]  # this process's share of the micro-batch
            hidden = model(input_ids=ids[rows], output_hidden_states=True).hidden_states
            losses = torch.stack([F.cross_entropy(model.classifier(h[:, 0]), labels[rows], reduction="none") for h in hidden], dim=1)
            update.backward(losses, weight=1 / %(accumulate)d)
        seen = update.step()
        assert not (seen.skipped or seen.stop), seen
        record["lambda"].append(update.multipliers()["descent"].tolist())
        record["means"].append(seen.means.tolist())
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)
    %(leave)s
    """
    )
    % SIZES
)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The unsharded model in one process: the trajectory a sharded run must follow."""
    (record,) = run_script(OWN_LOOP, tmp_path_factory.mktemp("fsdp") / "plain", 1, "plain")
    assert max(record["lambda"][-1]) > 0, "the constraints never became active"
    return record


@pytest.mark.parametrize("layout", ["layers", "head"])
def test_a_sharded_model_in_two_processes_steps_the_multipliers_and_layer_losses_of_one_plain_process(plain, layout, tmp_path):
    ranks = run_script(OWN_LOOP, tmp_path / layout, 2, layout)
    assert ranks[0]["shard"] == [16, 64], "each process holds half of a layer's weight: the model was sharded"
    for record in ranks:
        torch.testing.assert_close(torch.tensor(record["lambda"]), torch.tensor(plain["lambda"]), rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(torch.tensor(record["means"]), torch.tensor(plain["means"]), rtol=1e-4, atol=1e-6)
    assert ranks[0]["lambda"] == ranks[1]["lambda"], "the multipliers differ between processes"


# DescentTrainer given a model sharded by hand over 2 CPU processes; writes the error.
SHARDED_TRAINER = (
    textwrap.dedent(
        """
    %(preamble)s
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.distributed.init_process_group("gloo")
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    args = transformers.TrainingArguments(os.path.join(out, "out"), max_steps=1, report_to=[], use_cpu=True, ddp_backend="gloo")
    try:
        ld.DescentTrainer(model=model, args=args, train_dataset=[], constraints=[ld.Descent(alpha=0.5)], readout=lambda h, inputs: h.sum(-1))
        error = None
    except ld.ConfigError as refused:
        error = str(refused)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump({"error": error}, handle)
    %(leave)s
    """
    )
    % SIZES
)


def test_descent_trainer_refuses_a_model_sharded_by_hand_in_one_line_naming_the_ways_that_work(tmp_path):
    record, _ = run_script(SHARDED_TRAINER, tmp_path / "sharded", 2, "sharded")
    error = record["error"]
    assert error is not None and "\n" not in error, error
    assert "sharded by hand" in error and "fsdp='full_shard'" in error and "LayerwiseUpdate" in error


# The Trainer's own sharding on up to 2 GPUs, against the same Trainer run unsharded on one GPU;
# argv: out folder, then "plain", "fsdp" (FSDP2, each BertLayer a unit) or "zero2" (DeepSpeed ZeRO
# stage 2, docs/scaling.md's config).
TRAINER = (
    textwrap.dedent(
        """
    %(preamble)s
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 32, (%(rows)d, 6), generator=g)
    rows = [{"input_ids": x, "attention_mask": torch.ones(6, dtype=torch.long), "labels": int(x[1] >= 16)} for x in ids]

    def readout(hidden, inputs):
        return torch.nn.functional.cross_entropy(model.classifier(hidden[:, 0]), inputs["labels"], reduction="none")

    zero2 = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto",
             "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"}
    sharding = {
        "plain": {},
        "fsdp": {"fsdp": "full_shard", "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": ["BertLayer"]}},
        "zero2": {"deepspeed": zero2},
    }[layout]
    args = transformers.TrainingArguments(
        os.path.join(out, "out"), max_steps=%(steps)d, per_device_train_batch_size=%(batch)d // world, gradient_accumulation_steps=%(accumulate)d,
        learning_rate=1e-2, logging_steps=1, report_to=[], disable_tqdm=True, save_strategy="no", seed=0, **sharding,
    )
    trainer = ld.DescentTrainer(model=model, args=args, train_dataset=rows, constraints=[ld.Descent(alpha=0.5)], readout=readout, dual_lr=1.0)
    history = []

    class Record(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            history.append(trainer.update.multipliers()["descent"].tolist())

    trainer.add_callback(Record())
    trainer.train()
    losses = [[line[f"train/loss/l{k}"] for k in range(4)] for line in trainer.state.log_history if "train/loss/l0" in line]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump({"lambda": history, "layer_loss": losses}, handle)
    %(leave)s
    """
    )
    % SIZES
)


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="the Trainer's fsdp and deepspeed options need GPUs: on CPU processes accelerate runs DDP whatever fsdp says "
    "(the CPU test above shards by hand)",
)
@pytest.mark.parametrize(
    "layout",
    [
        "fsdp",
        pytest.param(
            "zero2",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed (pip install deepspeed)"
            ),
        ),
    ],
)
def test_descent_trainer_sharded_by_the_trainer_follows_the_unsharded_trainer(layout, tmp_path):
    (plain,) = run_script(TRAINER, tmp_path / "plain", 1, "plain")
    assert max(plain["lambda"][-1]) > 0, "the constraints never became active"
    # accelerate shards only under a launcher, so one GPU runs torchrun too
    ranks = run_script(TRAINER, tmp_path / layout, min(torch.cuda.device_count(), 2), layout, torchrun=True)
    for record in ranks:
        torch.testing.assert_close(torch.tensor(record["lambda"]), torch.tensor(plain["lambda"]), rtol=1e-3, atol=1e-5)
        torch.testing.assert_close(torch.tensor(record["layer_loss"]), torch.tensor(plain["layer_loss"]), rtol=1e-3, atol=1e-5)
