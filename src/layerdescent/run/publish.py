"""Report files (summary.md, plots) land in a folder only over nothing, or over files layerdescent wrote there.

    refuse_foreign(out)                        # before a bench trains: its --out holds no summary or plot of yours
    with Publication(out) as pub:              # the report is made in a private folder inside ``out`` ...
        title, note, workers, judging = pub.remembered(root, title, note, workers, judging)   # a bench's survive `report`
        images = plot(groups, pub.stage)
        pub.write("summary.md", text)
    # ... and moved in at the end, each file over nothing or over one the manifest says layerdescent wrote

A file is layerdescent's when the folder's manifest (``.layerdescent-report.json``) lists it with the
sha256 it was written with, so a summary you edited since is yours. In a folder reported into
before the manifest existed, a summary.md in layerdescent's layout and the plots it shows are its own.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from layerdescent.errors import ConfigError, LayerdescentError
from layerdescent.readback import read_json
from layerdescent.run.files import refuse_links, write_atomic, write_output

MANIFEST = ".layerdescent-report.json"
MAX_MANIFEST_BYTES = 2**20  # a manifest lists a dozen files and their sha256s
STAGE = ".layerdescent-report-"  # + pid: the private folder a report is made in
# What a report writes at the top of its folder (report._plot's names); a bench checks them before it trains, and
# whatever a report writes is checked again when it is moved in.
REPORT_FILES = (
    "summary.md",
    "endpoints.md",
    "tradeoff.png",
    "loss_vs_layer.png",
    "metric_vs_gamma.png",
    "metric_vs_gamma_domains.png",
    "descent_rate.png",
    "traces.png",
    "ablation_*.png",
)
# Lines only layerdescent's own summary holds (its Cost section and closing list of plots).
SUMMARY_MARKS = ("\n## Cost\n\nEach run's median step time.", "\n## Plots\n")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: alive
    return True


def _read(path: Path) -> bytes | None:
    """The bytes of the plain file at ``path``; None for a link, a directory, a pipe (never waited on) or anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        # a rename replaces this name alone, so a second hard link (a backup made with cp -al) is no obstacle
        return handle.read() if stat.S_ISREG(os.fstat(fd).st_mode) else None


def _sha256(path: Path) -> str | None:
    """The sha256 of the plain file at ``path``, or None (see :func:`_read`)."""
    data = _read(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


def _manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, or None where it has none (or one of another shape); ReadbackError where it is damaged, a link or huge."""
    data = read_json(
        folder / MANIFEST,
        limit=MAX_MANIFEST_BYTES,
        optional=True,
        fix="delete it and run again (the files it listed are then kept as yours, not replaced)",
    )
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def owned(folder: Path) -> dict[str, list[str]]:
    """The files in ``folder`` that layerdescent wrote, each with the sha256s it may have now."""
    manifest = _manifest(folder)
    if manifest is not None:
        return {name: list(hashes) for name, hashes in manifest["files"].items() if isinstance(hashes, list)}
    summary = folder / "summary.md"  # a report from before the manifest: recognized by its layout
    try:
        text = (_read(summary) or b"").decode("utf-8")
    except UnicodeDecodeError:
        return {}
    if not text.startswith("# ") or not all(mark in text for mark in SUMMARY_MARKS):
        return {}
    plots = text.rsplit("\n## Plots\n", 1)[1]
    names = ["summary.md", *re.findall(r"^!\[[^\]]*\]\(([^)/]+\.png)\)$", plots, flags=re.MULTILINE)]
    return {name: [digest] for name in names if (digest := _sha256(folder / name))}


def foreign(folder: Path, names: list[str]) -> list[str]:
    """Which of ``names`` exist in ``folder`` but are not layerdescent's as it wrote them (yours, a link, or changed since)."""
    mine = owned(folder)
    return [name for name in names if os.path.lexists(folder / name) and _sha256(folder / name) not in mine.get(name, [])]


def refuse_foreign(folder: Path, command: str = "bench") -> None:
    """Raise ConfigError when ``folder`` holds a summary.md or plot that a report would replace and layerdescent did not write."""
    try:
        present = sorted(p.name for p in Path(folder).iterdir() if any(fnmatch.fnmatchcase(p.name, pattern) for pattern in REPORT_FILES))
    except (FileNotFoundError, NotADirectoryError):
        return
    theirs = foreign(Path(folder), present)
    if theirs:
        raise ConfigError(
            f"{Path(folder) / theirs[0]} was not written by layerdescent (or was changed since), and the {command}'s summary or plots would replace it: "
            f"move it away, or --out another directory (nothing was written)"
        )


def write_page(path: Path, text: str) -> None:
    """Write one page a command was told to write (``compare --out``): over nothing, or over the page layerdescent wrote there, unchanged since (the folder's manifest says), and record it."""
    path = Path(path)
    folder, name = path.parent, path.name
    write_output(path, text, lambda head: not foreign(folder, [name]), lambda: _list(folder, name, text))
    _list(folder, name, text, written=True)


def _list(folder: Path, name: str, text: str, written: bool = False) -> None:
    """Record page ``name`` in ``folder``'s manifest: before it is written with the sha256 it has now too (a kill between leaves it known as ours), after with the new alone."""
    refuse_links(folder, (MANIFEST,))
    recorded = _manifest(folder) or {}
    files = {n: hashes for n, hashes in owned(folder).items() if os.path.lexists(folder / n)}
    new = hashlib.sha256(text.encode()).hexdigest()
    files[name] = [new] if written else [new, *files.get(name, [])]
    write_atomic(folder / MANIFEST, json.dumps({**recorded, "files": files}, indent=2, sort_keys=True) + "\n")


class Publication:
    """A report made in a private folder inside ``folder`` and moved in whole at the end, replacing only layerdescent's own files."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.stage = self.folder
        self._recorded = _manifest(self.folder) or {}
        self._made: dict[str, Any] = {}

    def remembered(
        self, root: Path, title: str | None, note: str, workers: int | None, judging: dict | None = None
    ) -> tuple[str | None, str, int | None, dict | None]:
        """``title``, ``note``, ``workers`` and ``judging`` (a bench's judging keys), each from the last report here of the same
        ``root`` when not given (so `report` keeps a bench's)."""
        where = os.path.relpath(Path(root).resolve(), self.folder.resolve())  # relative, so a bench moved whole keeps it
        recorded = self._recorded if self._recorded.get("root") == where else {}
        title = title if title is not None else recorded.get("title") if isinstance(recorded.get("title"), str) else None
        note = note or (recorded.get("note") if isinstance(recorded.get("note"), str) else "")
        workers = workers if workers is not None else recorded.get("workers") if isinstance(recorded.get("workers"), int) else None
        judging = judging if judging is not None else recorded.get("judging") if isinstance(recorded.get("judging"), dict) else None
        self._made = {"root": where, "title": title, "note": note, "workers": workers, "judging": judging}
        return title, note, workers, judging

    def write(self, name: str, text: str) -> None:
        """Stage file ``name`` with ``text``."""
        (self.stage / name).write_text(text, encoding="utf-8")

    def __enter__(self) -> Publication:
        for stale in self.folder.glob(f"{STAGE}*-*"):  # left by a report that was killed: its pid is in the name
            pid = stale.name.removeprefix(STAGE).split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)) and stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        try:
            self.stage = Path(tempfile.mkdtemp(dir=self.folder, prefix=f"{STAGE}{os.getpid()}-"))
        except OSError as exc:
            raise self._unwritable(exc) from None
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if exc is None:
                self._move_in()
            elif isinstance(exc, OSError):
                raise self._unwritable(exc) from None
        finally:
            shutil.rmtree(self.stage, ignore_errors=True)

    def _unwritable(self, exc: OSError) -> LayerdescentError:
        return LayerdescentError(
            f"cannot write the report into {self.folder}: {exc.strerror or exc}: make it writable, or report --out a directory you can write to"
        )

    def _move_in(self) -> None:
        names = sorted(p.name for p in self.stage.iterdir() if stat.S_ISREG(p.lstat().st_mode))
        theirs = foreign(self.folder, names)
        if theirs:
            raise LayerdescentError(
                f"{self.folder / theirs[0]} was not written by layerdescent (or was changed since): the report would replace it; "
                f"move it away, or report --out another directory"
            )
        refuse_links(self.folder, (MANIFEST,))
        files = {name: hashes for name, hashes in owned(self.folder).items() if os.path.lexists(self.folder / name)}
        new = {name: _sha256(self.stage / name) for name in names}
        try:
            # Listed first with both hashes, so a kill between the moves leaves every file still known as ours.
            self._record({**files, **{name: [digest, *files.get(name, [])] for name, digest in new.items()}})
            for name in names:
                os.replace(self.stage / name, self.folder / name)
            # Hashed where they landed: a report writing here at the same time leaves a list that matches the files either way.
            self._record({**files, **{name: [digest] for name in names if (digest := _sha256(self.folder / name))}})
        except OSError as exc:
            raise self._unwritable(exc) from None

    def _record(self, files: dict[str, list[str]]) -> None:
        made = {k: v for k, v in self._made.items() if v not in (None, "", {})}
        write_atomic(self.folder / MANIFEST, json.dumps({**made, "files": files}, indent=2, sort_keys=True) + "\n")
