"""Video denoising data: real grey clips split by time, a synthetic generator, and the perturbations."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import datasets
import numpy as np
import torch

import layerdescent
from layerdescent.assets import extract
from layerdescent_video.assets import VIDEOS

SHARES = {"train": 0.70, "validation": 0.15}  # the test split is the last 15% of frames


def video_path(dataset: str) -> Path:
    """The extracted file of a real dataset's video; AssetError with the fetch command if it is not fetched."""
    asset, member = VIDEOS[dataset]
    return extract(asset, member)


@lru_cache(maxsize=4)
def decode_video(path: str, height: int) -> np.ndarray:
    """Every frame of a video file, grey, in [0, 1], resized to ``height`` rows at its aspect ratio: N x height x W."""
    cv2 = layerdescent.require("cv2", "video", "decoding the video clips")
    capture = cv2.VideoCapture(path)
    if not capture.isOpened():
        raise layerdescent.DataError(f"opencv cannot open {path}; fetch the asset again with --force if the file is damaged")
    frames = []
    try:
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            grey = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY)
            width = max(1, round(grey.shape[1] * height / grey.shape[0]))
            frames.append(cv2.resize(grey, (width, height), interpolation=cv2.INTER_AREA))
    finally:
        capture.release()
    if not frames:
        raise layerdescent.DataError(f"opencv decoded no frame from {path}; its build may lack the codec (install opencv-python-headless)")
    video = np.stack(frames).astype(np.float32) / 255
    video.flags.writeable = False  # the cache hands the same array to every caller
    return video


def video_frames(dataset: str, height: int) -> np.ndarray:
    """``decode_video`` of a real dataset's fetched video."""
    return decode_video(str(video_path(dataset)), height)


def synthetic_frames(num_frames: int, height: int, width: int, seed: int) -> np.ndarray:
    """A textured static background with a few small bright objects moving across it, N x H x W in [0, 1]."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0:height, 0:width].astype(np.float32) / max(height, width)
    background = np.zeros((height, width), np.float32)
    for _ in range(6):
        fy, fx = rng.uniform(-4, 4, size=2)
        background += rng.uniform(0.5, 1.0) * np.sin(2 * np.pi * (fy * rows + fx * cols) + rng.uniform(0, 2 * np.pi))
    background = 0.1 + 0.5 * (background - background.min()) / (np.ptp(background) + 1e-8)
    count = 1 + height * width // 1024
    position = rng.uniform(0, 1, size=(count, 2)) * [height - 1, width - 1]
    velocity = rng.uniform(-1.5, 1.5, size=(count, 2))
    radius = rng.uniform(1.0, 2.5, size=count)
    grid = np.stack(np.mgrid[0:height, 0:width], axis=-1).astype(np.float32)
    frames = np.empty((num_frames, height, width), np.float32)
    for t in range(num_frames):
        distance = ((grid[None] - position[:, None, None]) ** 2).sum(-1)
        blobs = np.exp(-distance / (2 * radius[:, None, None] ** 2)).max(axis=0)
        frames[t] = np.clip(background + 0.9 * blobs, 0, 1)
        position += velocity
        # Objects bounce off the borders so they stay in view for the whole video.
        for axis, size in enumerate((height - 1, width - 1)):
            out = (position[:, axis] < 0) | (position[:, axis] > size)
            velocity[out, axis] *= -1
            position[:, axis] = np.clip(position[:, axis], 0, size)
    return frames


def time_bounds(num_frames: int) -> dict[str, tuple[int, int]]:
    """The frame range [start, stop) of each split: the first 70% train, the next 15% validation, the rest test."""
    train = int(SHARES["train"] * num_frames)
    validation = int((SHARES["train"] + SHARES["validation"]) * num_frames)
    return {"train": (0, train), "validation": (train, validation), "test": (validation, num_frames)}


def cut_clips(frames: np.ndarray, length: int, patch: int, stride: int) -> dict[str, dict[str, np.ndarray]]:
    """Clips of ``length`` frames of every ``patch`` x ``patch`` tile, per split; no clip crosses a split boundary.

    A clip is the same tile in consecutive frames, T x patch^2 pixels; clips start every ``stride``
    frames inside their split. Columns: ``clip``, ``start`` (its first frame) and ``tile`` (its index
    in the frame, row-major); pixels beyond the last whole tile are cropped.
    """
    num_frames, height, width = frames.shape
    rows, cols = height // patch, width // patch
    if rows == 0 or cols == 0:
        raise layerdescent.DataError(
            f"frames of {height}x{width} pixels hold no {patch}x{patch} tile; lower task.patch or raise task.height"
        )
    tiles = frames[:, : rows * patch, : cols * patch].reshape(num_frames, rows, patch, cols, patch).transpose(1, 3, 0, 2, 4)
    tiles = tiles.reshape(rows * cols, num_frames, patch * patch)  # tile x frame x pixel
    out = {}
    for split, (begin, end) in time_bounds(num_frames).items():
        starts = np.arange(begin, end - length + 1, stride)
        if len(starts) == 0:
            raise layerdescent.DataError(
                f"the {split} split has frames {begin}..{end - 1} of {num_frames}, fewer than one clip of {length}; lower task.frames or use a longer video"
            )
        clips = np.stack([tiles[:, s : s + length] for s in starts])  # start x tile x T x P
        out[split] = {
            "clip": np.ascontiguousarray(clips.reshape(-1, length, patch * patch)),
            "start": np.repeat(starts, rows * cols),
            "tile": np.tile(np.arange(rows * cols), len(starts)),
        }
    return out


def clip_datasets(frames: np.ndarray, length: int, patch: int, stride: int) -> dict[str, datasets.Dataset]:
    """``cut_clips`` as torch-formatted ``datasets.Dataset`` splits."""
    return {
        split: datasets.Dataset.from_dict(columns).with_format("torch")
        for split, columns in cut_clips(frames, length, patch, stride).items()
    }


def perturb(clip: torch.Tensor, gamma: float, kind: str) -> torch.Tensor:
    """The clip at perturbation level ``gamma``: ``gaussian`` adds gamma N(0, I); ``salt-pepper`` sets a gamma share of pixels to 0 or 1."""
    if gamma == 0:
        return clip
    if kind == "salt-pepper":
        hit = torch.rand_like(clip) < gamma
        return torch.where(hit, (torch.rand_like(clip) < 0.5).to(clip.dtype), clip)
    return clip + gamma * torch.randn_like(clip)
