"""Every file layerdescent reads back is untrusted: huge, deep, damaged or linked files are one line, never a traceback."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import pytest
from helpers import fake_results
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerdescent.analysis.plots import read_log
from layerdescent.bench.executors.base import MARKER, mark_out
from layerdescent.cli import main
from layerdescent.errors import LayerdescentError
from layerdescent.readback import read_json, read_jsonl
from layerdescent.results import read_results
from layerdescent.run import layout, publish, rundir

DEEP = b"[" * 200_000


def fake_log(solver: str) -> str:
    record = {"event": "train", "step": 10, "loss": [0.3, 0.2, 0.1], "violation": {"descent": [0.0, 0.0]}, "feasible": 1.0}
    if solver == "primal-dual":
        record["lambda"] = {"descent": [0.1, 0.0]}
    return json.dumps(record) + "\n" + json.dumps({"event": "epoch", "epoch": 0}) + "\n"


@pytest.fixture
def bench(tmp_path):
    for label, solver in (("erm", "erm"), ("primal-dual", "primal-dual")):
        for seed in (0, 1):
            run = tmp_path / "bench" / f"{label}-s{seed}"
            run.mkdir(parents=True)
            (run / "config.toml").write_text(f'solver = "{solver}"\nseed = {seed}\n')
            (run / "results.json").write_text(json.dumps(fake_results(label, solver, seed, 1.0 + seed, 2.0, 0.01)))
            (run / "metrics.jsonl").write_text(fake_log(solver))
    return tmp_path / "bench"


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_results_json_nested_200000_deep_is_one_line_naming_it(bench, capsys):
    path = bench / "erm-s0" / "results.json"
    path.write_bytes(DEEP)
    assert main(["report", str(bench)]) == 2
    err = _one_line(capsys)
    assert str(path) in err and "deep" in err and "re-run" in err


def test_a_results_json_that_is_a_symbolic_link_is_refused(bench, tmp_path, capsys):
    path = bench / "erm-s0" / "results.json"
    elsewhere = tmp_path / "elsewhere.json"
    os.replace(path, elsewhere)
    path.symlink_to(elsewhere)
    assert main(["report", str(bench)]) == 2
    assert f"{path} is a symbolic link" in _one_line(capsys)


def test_a_gzipped_log_with_a_damaged_body_is_one_line(bench, capsys):
    log = bench / "primal-dual-s0" / "metrics.jsonl"
    body = gzip.compress(log.read_bytes())
    log.unlink()
    gz = log.with_name("metrics.jsonl.gz")
    gz.write_bytes(body[:10] + bytes(b ^ 0x55 for b in body[10:-8]) + body[-8:])  # the header reads, the deflate stream does not
    assert main(["report", str(bench)]) == 2
    assert str(gz) in _one_line(capsys)


def test_a_gzipped_log_that_expands_past_the_cap_stops_at_the_cap(tmp_path):
    bomb = tmp_path / "metrics.jsonl.gz"
    with gzip.open(bomb, "wb") as handle:
        for _ in range(64):
            handle.write(b"0" * 2**20)  # 64 MiB of zeros in about 64 KiB
    start = time.perf_counter()
    with pytest.raises(LayerdescentError, match="expands to more than the 1 MiB"):
        read_jsonl(bomb, limit=2**20)
    assert time.perf_counter() - start < 5  # it stopped at the cap, not after inflating all of it


def test_a_report_manifest_nested_200000_deep_is_one_line(bench, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / publish.MANIFEST).write_bytes(DEEP)
    assert main(["report", str(bench), "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert str(out / publish.MANIFEST) in err and "delete it" in err


def test_a_partial_evaluation_nested_deep_or_linked_is_evaluated_again(tmp_path):
    key = {"step": 8, "epoch": 1, "eval": {}}
    (tmp_path / layout.EVALUATION_PARTIAL).write_bytes(DEEP)
    done, line = rundir.partial_evaluation(tmp_path, key, [0.0], [], 1)
    assert done is None and "the evaluation starts again" in line
    real = tmp_path / "real.json"
    rundir.save_partial_evaluation(tmp_path, key, {"gammas": []})
    os.replace(tmp_path / layout.EVALUATION_PARTIAL, real)
    (tmp_path / layout.EVALUATION_PARTIAL).symlink_to(real)
    done, line = rundir.partial_evaluation(tmp_path, key, [0.0], [], 1)
    assert done is None and "symbolic link" in line


def test_a_log_line_nested_deep_does_not_stop_the_status_of_a_run(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(b'{"event": "train", "step": 3}\n' + DEEP + b"\n")
    assert rundir.last_record(tmp_path) == {"event": "train", "step": 3}


# -- every reader, fed anything: what it returns, or one line of the project's error ------------------------------

KEY = {"step": 8, "epoch": 1, "eval": {}}
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=24
)
record = st.fixed_dictionaries(
    {"gamma": st.sampled_from([0.0, 0.5]) | scalars, "layer_loss": st.lists(st.floats() | scalars, max_size=3) | scalars},
    optional={"descent_rate": st.lists(scalars, max_size=3) | scalars, "metrics": values},
)
partials = st.fixed_dictionaries(
    {
        "key": st.just(KEY),
        "evaluation": st.fixed_dictionaries(
            {}, optional={"gammas": st.lists(record, max_size=3) | values, "domains": values, "eval_seconds": scalars}
        ),
    }
)
as_json = values.map(lambda v: json.dumps(v).encode())
signed = partials.map(
    lambda p: json.dumps({**p, "sha256": hashlib.sha256(json.dumps(p["evaluation"], sort_keys=True).encode()).hexdigest()}).encode()
)
contents = st.one_of(
    st.binary(max_size=512),
    as_json,
    signed,
    st.integers(1, 300_000).map(lambda n: b"[" * n),
    st.integers(1, 3000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.lists(as_json, max_size=5).map(lambda lines: b"\n".join(lines)),
)


def _variants(data: bytes) -> list[bytes]:
    """``data`` as it is, gzipped, and gzipped then cut short."""
    packed = gzip.compress(data)
    return [data, packed, packed[: len(packed) // 2]]


def _single_line(exc: LayerdescentError) -> None:
    assert "\n" not in str(exc) and str(exc), repr(exc)


def _read_every_way(folder: Path, data: bytes) -> None:
    """Feed ``data`` to every reader of a file layerdescent reads back; each returns or raises one line."""
    readers = [
        ("results.json", read_results),
        ("x.json", read_json),
        ("metrics.jsonl", read_log),
        ("metrics.jsonl.gz", read_log),
        ("metrics.jsonl.gz", read_jsonl),
        (publish.MANIFEST, lambda path: publish.owned(path.parent)),
        (layout.FAILURE, lambda path: rundir.failure(path.parent)),
        ("metrics.jsonl", lambda path: rundir.last_record(path.parent)),
        (layout.EVALUATION_PARTIAL, lambda path: rundir.partial_evaluation(path.parent, KEY, [0.0, 0.5], ["other"], 2)),
        ("results.json", rundir.json_object),
        (MARKER, lambda path: mark_out(path.parent)),
    ]
    for name, reader in readers:
        for variant in _variants(data) if name.endswith(".gz") else [data]:
            path = folder / name
            path.write_bytes(variant)
            try:
                reader(path)
            except LayerdescentError as exc:
                _single_line(exc)
            path.unlink()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(contents)
def test_every_reader_answers_anything_with_its_value_or_one_line(data):
    with tempfile.TemporaryDirectory() as folder:
        _read_every_way(Path(folder), data)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(signed)
def test_a_signed_partial_evaluation_keeps_only_records_that_fit(data):
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / layout.EVALUATION_PARTIAL).write_bytes(data)
        done, line = rundir.partial_evaluation(Path(folder), KEY, [0.0, 0.5], ["other"], 2)
        assert line is None or "\n" not in line
        for kept in [*(done or {}).get("gammas", []), *(r for rs in (done or {}).get("domains", {}).values() for r in rs)]:
            assert kept["gamma"] in (0.0, 0.5) and len(kept["layer_loss"]) == 3


PENDING: set[str] = set()  # readers not yet routed through layerdescent.readback: none
PARSERS = {("json", "loads"), ("json", "load"), ("gzip", "decompress"), ("gzip", "open"), ("pickle", "load"), ("pickle", "loads")}


def test_every_json_or_gzip_read_in_the_package_goes_through_the_bounded_reader():
    import ast

    package = Path(__file__).resolve().parents[1] / "src" / "layerdescent"
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            func = getattr(node, "func", None)
            if isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if (func.value.id, func.attr) in PARSERS:
                    found.add(str(path.relative_to(package)))
    assert found - PENDING == {"readback.py"}, sorted(found - PENDING - {"readback.py"})


def test_a_directory_or_a_pipe_where_a_file_is_read_back_is_one_line(tmp_path):
    (tmp_path / "results.json").mkdir()
    with pytest.raises(LayerdescentError, match="it is not a plain file"):
        read_results(tmp_path / "results.json")
    os.mkfifo(tmp_path / "metrics.jsonl")  # never waited on
    with pytest.raises(LayerdescentError, match="it is not a plain file"):
        read_log(tmp_path / "metrics.jsonl")
