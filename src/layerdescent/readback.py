"""Every file layerdescent reads back (its own run files, a report's manifest, results.json, logs), read as untrusted input.

    from layerdescent.readback import read_json, read_jsonl

    table = read_json(run_dir / "tuning.json", fix="delete it and run the bench again")   # size and nesting bounded
    plan = read_json(path, optional=True)                 # None where the file does not exist
    records = read_jsonl(run_dir / "metrics.jsonl.gz")    # each line a JSON object; a .gz is capped as it expands

A file that is too large, nested too deep, not UTF-8, not JSON, a damaged gzip, a symbolic link or
not a plain file raises :class:`ReadbackError`: one line naming the file and the fix, which the CLI
prints and exits 2 on. Nothing here recurses on the data, so no input raises RecursionError or
MemoryError past the caps.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import zlib
from pathlib import Path
from typing import Any

from layerdescent.errors import LayerdescentError

MAX_JSON_BYTES = 16 * 2**20  # a results.json is a few KiB; 16 MiB parses into at most a few hundred MB of objects
MAX_LOG_BYTES = 128 * 2**20  # a metrics.jsonl, after decompression; the committed benches' largest is a few MiB
MAX_DEPTH = 64  # arrays and objects within each other; layerdescent's own files need 6
FIX = "delete it and run again"
_CHUNK = 1 << 20


class ReadbackError(LayerdescentError):
    """A file layerdescent wrote and reads back is missing its shape: too large, too deep, damaged, a link."""


def _fail(path: Path, problem: str, fix: str) -> ReadbackError:
    return ReadbackError(f"{path} {problem}: {fix}")


def _size(count: int) -> str:
    return f"{count / 2**20:.0f} MiB" if count >= 2**20 else f"{count} bytes"


def read_bytes(
    path: str | Path, *, limit: int = MAX_JSON_BYTES, fix: str = FIX, optional: bool = False, tail: bool = False
) -> bytes | None:
    """The bytes of the plain file ``path``, at most ``limit`` of them (its last ``limit`` when ``tail``), never through a symbolic link; None for a missing file when ``optional``."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if optional:
            return None
        raise _fail(path, "does not exist", fix) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ReadbackError(
                f"{path} is a symbolic link; layerdescent reads only files of its own there: remove the link and run again"
            ) from None
        raise ReadbackError(f"cannot read {path}: {exc.strerror or exc}; {fix}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # a directory cannot be read, a pipe would hang, a device never ends
        os.close(fd)
        raise ReadbackError(f"cannot read {path}: it is not a plain file (a directory, a pipe, a device): remove it, or {fix}")
    with os.fdopen(fd, "rb") as handle:
        if tail:
            handle.seek(max(0, info.st_size - limit))
        elif info.st_size > limit:
            raise _fail(path, f"is {_size(info.st_size)}, more than the {_size(limit)} layerdescent reads back", fix)
        try:
            data = handle.read(limit + (not tail))  # it may have grown since fstat
        except OSError as exc:
            raise ReadbackError(f"cannot read {path}: {exc.strerror or exc}; {fix}") from None
    if len(data) > limit and not tail:
        raise _fail(path, f"is more than the {_size(limit)} layerdescent reads back", fix)
    return data


def depth(value: Any) -> int:
    """How deep arrays and objects lie within each other in parsed JSON ``value`` (a scalar: 0), counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def parse_json(data: bytes | str, where: str | Path, *, max_depth: int = MAX_DEPTH, fix: str = FIX) -> Any:
    """JSON ``data`` (read from ``where``, named in the error) parsed and checked to nest at most ``max_depth`` deep."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise _fail(Path(where), f"is not text (a binary or damaged file: byte {exc.start} is not UTF-8)", fix) from None
    try:
        value = json.loads(text)
    except RecursionError:  # the C parser refuses deep nesting this way, before it can exhaust the stack
        value = _TOO_DEEP
    except ValueError as exc:
        msg = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else str(exc).splitlines()[0][:200]
        raise _fail(Path(where), f"is not valid JSON ({msg}; truncated or edited?)", fix) from None
    if value is _TOO_DEEP or depth(value) > max_depth:
        raise _fail(Path(where), f"nests arrays or objects more than {max_depth} deep, which layerdescent never writes", fix)
    return value


_TOO_DEEP = object()


def read_json(path: str | Path, *, limit: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH, fix: str = FIX, optional: bool = False) -> Any:
    """The JSON value in file ``path``, read within ``limit`` bytes and ``max_depth`` nesting; None for a missing file when ``optional``.

    Example: ``tuning = read_json(out / "tuning.json", fix="delete it and run the bench again", optional=True)``.
    """
    data = read_bytes(path, limit=limit, fix=fix, optional=optional)
    return None if data is None else parse_json(data, path, max_depth=max_depth, fix=fix)


def read_json_object(path: str | Path, *, what: str = "a JSON object", fix: str = FIX, **bounds: Any) -> dict[str, Any] | None:
    """:func:`read_json` where the file must hold an object (``what`` names it in the error); None for a missing file when ``optional``."""
    value = read_json(path, fix=fix, **bounds)
    if value is None and bounds.get("optional"):
        return None
    if not isinstance(value, dict):
        raise _fail(Path(path), f"holds a JSON {type(value).__name__}, not {what}", fix)
    return value


def read_text_lines(path: str | Path, *, limit: int = MAX_LOG_BYTES, fix: str = FIX) -> list[bytes] | list[bytearray]:
    """The lines of ``path``, or of its gzip-compressed body when it ends in ``.gz``, capped at ``limit`` bytes after decompression."""
    path = Path(path)
    if not str(path).endswith(".gz"):
        return (read_bytes(path, limit=limit, fix=fix) or b"").splitlines()
    view = memoryview(read_bytes(path, limit=limit, fix=fix) or b"")
    out, pos = bytearray(), 0
    try:
        while pos < len(view):  # a .gz may hold several members, as `cat a.gz b.gz` makes
            inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            while not inflate.eof:
                if pos >= len(view):
                    raise _fail(path, "ends before its gzip body does (truncated)", fix)
                chunk = view[pos : pos + _CHUNK]
                pos += len(chunk)
                out += inflate.decompress(chunk, limit + 1 - len(out))  # never more than one byte past the cap
                if len(out) > limit:
                    raise _fail(path, f"expands to more than the {_size(limit)} layerdescent reads back", fix)
            pos -= len(inflate.unused_data)
    except zlib.error as exc:
        raise _fail(path, f"is not a whole gzip file ({exc})", fix) from None
    return out.splitlines()


def read_jsonl(path: str | Path, *, limit: int = MAX_LOG_BYTES, max_depth: int = MAX_DEPTH, fix: str = FIX) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (``metrics.jsonl`` or ``metrics.jsonl.gz``), each an object; blank lines are skipped."""
    records = []
    for number, line in enumerate(read_text_lines(path, limit=limit, fix=fix), 1):
        if not line.strip():
            continue
        record = parse_json(line, f"{path}:{number}", max_depth=max_depth, fix=fix)
        if not isinstance(record, dict):
            raise _fail(Path(f"{path}:{number}"), f"holds a JSON {type(record).__name__}, not a log record", fix)
        records.append(record)
    return records
