"""Fuzzed bad configs: every one exits 2 with one line naming the key, never a traceback."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import tomli_w
from conftest import lista_task
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerdescent.cli import main

BASE = {
    "seed": 0,
    "task": lista_task(train_size=64, validation_size=16, test_size=16),
    "train": {"epochs": 1, "batch_size": 16, "lr": 0.01, "progress": False},
    "solver": {"name": "primal-dual", "dual_lr": 0.5, "dual_every": 1},
    "constraints": [{"kind": "descent", "alpha": 0.05, "reference": "detached"}],
    "eval": {"gammas": [0.0, 0.5]},
}

# (path, a value of the wrong type, the field name the message must contain)
TYPED_FIELDS = {
    ("train", "epochs"): "int",
    ("train", "lr"): "float",
    ("train", "progress"): "bool",
    ("train", "optimizer"): "str",
    ("solver", "dual_lr"): "float",
    ("solver", "scheme"): "str",
    ("eval", "gammas"): "list",
    ("eval", "batch_size"): "int",
    ("task", "layers"): "int",
    ("task", "tied"): "bool",
    ("seed",): "int",
    ("constraints", 0, "alpha"): "float",
    ("constraints", 0, "reference"): "str",
}
WRONG = {
    "int": st.one_of(
        st.text(max_size=5),
        st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x)),
        st.lists(st.integers(), max_size=2),
        st.booleans(),
    ),
    "float": st.one_of(st.text(max_size=5), st.lists(st.floats(allow_nan=False), max_size=2), st.booleans()),
    "bool": st.one_of(st.text(max_size=5), st.integers(), st.floats(allow_nan=False, allow_infinity=False)),
    "str": st.one_of(
        st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.lists(st.text(max_size=3), max_size=2), st.booleans()
    ),
    "list": st.one_of(st.text(max_size=5), st.integers(), st.lists(st.text(min_size=1, max_size=3), min_size=1, max_size=2)),
}
OUT_OF_RANGE = [
    (("train", "epochs"), st.integers(max_value=0)),
    (("train", "batch_size"), st.integers(max_value=0)),
    (("train", "lr"), st.floats(max_value=0, allow_nan=False, allow_infinity=False)),
    (("train", "grad_clip"), st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False)),
    (("solver", "dual_lr"), st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False)),
    (("solver", "dual_every"), st.integers(max_value=0)),
    (
        ("constraints", 0, "alpha"),
        st.one_of(
            st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
            st.floats(min_value=1.0, allow_nan=False, allow_infinity=False),
        ),
    ),
    (("constraints", 0, "resilience"), st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False)),
    (("eval", "batch_size"), st.integers(max_value=0)),
    (("task", "layers"), st.integers(max_value=0)),
]
NAMES = [("task", "name"), ("constraints", 0, "kind"), ("solver", "name"), ("constraints", 0, "reference"), ("train", "optimizer")]
identifiers = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)


def set_at(config, path, value):
    node = config
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def run_bad(config):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bad.toml"
        path.write_text(tomli_w.dumps(config))
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = main(["run", str(path), "--out", str(Path(tmp) / "out")])
        trained = (Path(tmp) / "out").exists()
    lines = err.getvalue().splitlines()
    assert status == 2, (config, err.getvalue())
    assert len(lines) == 1 and lines[0].startswith("layerdescent: error: "), lines
    assert not trained
    return lines[0]


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(field=st.sampled_from(sorted(TYPED_FIELDS, key=str)), data=st.data())
def test_a_value_of_the_wrong_type_names_its_key(field, data):
    config = copy.deepcopy(BASE)
    set_at(config, field, data.draw(WRONG[TYPED_FIELDS[field]]))
    assert str(field[-1]) in run_bad(config)


@FUZZ
@given(case=st.sampled_from(OUT_OF_RANGE), data=st.data())
def test_an_out_of_range_number_names_its_key(case, data):
    field, values = case
    config = copy.deepcopy(BASE)
    set_at(config, field, data.draw(values))
    assert str(field[-1]) in run_bad(config)


@FUZZ
@given(table=st.sampled_from([(), ("task",), ("train",), ("solver",), ("eval",), ("constraints", 0)]), key=identifiers)
def test_an_unknown_key_is_named(table, key):
    config = copy.deepcopy(BASE)
    node = config
    for part in table:
        node = node[part]
    allowed = {"task", "seed", "label", "train", "solver", "eval", "constraints", "perturbation", "name", "kind", "bench"}
    if key in node or key in allowed or (table == ("task",) and key in {"noise", "tied", "x0", "weights", "data_seed", "init"}):
        return
    node[key] = 1
    message = run_bad(config)
    assert "unknown key" in message and key in message


@FUZZ
@given(field=st.sampled_from(NAMES), name=identifiers)
def test_an_unknown_name_is_refused_with_what_is_allowed(field, name):
    if name in {"lista", "descent", "bound", "erm", "penalty", "live", "detached", "anchored", "adam", "adamw", "sgd"}:
        return
    config = copy.deepcopy(BASE)
    set_at(config, field, name)
    message = run_bad(config)
    assert name in message and ("known" in message or "allowed" in message)


@FUZZ
@given(path=st.sampled_from([("task", "name"), ("constraints", 0, "kind"), ("task",)]))
def test_deleting_a_required_key_names_it(path):
    config = copy.deepcopy(BASE)
    node = config
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    assert "required" in run_bad(config)


def test_an_empty_gamma_grid_is_refused():
    config = copy.deepcopy(BASE)
    config["eval"]["gammas"] = []
    assert "eval.gammas" in run_bad(config)


@FUZZ
@given(name=identifiers)
def test_duplicate_constraint_names_are_refused(name):
    config = copy.deepcopy(BASE)
    config["constraints"] = [{"kind": "descent", "name": name}, {"kind": "bound", "name": name, "value": 1.0}]
    said = run_bad(config)  # one line: the name used twice, or (a name Cooper's problem keeps, e.g. 'to') reserved
    assert f"{name!r} is used twice" in said or f"{name!r} is reserved" in said
