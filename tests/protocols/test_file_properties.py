"""Property tests of the run-file boundary (issue #34, item 6), each a quick hypothesis run in the fast tier: one file
of a run directory (config.json, metrics.jsonl, status.json, provenance.json, outcomes.json, an adapter's config or
weights) replaced by random bytes, a truncated copy, the same JSON with a value of another type, a link or a FIFO.
Whatever comes, `pubswap verify` and `pubswap report` answer (exit code 0) or print their one-line error (exit code
2), and publish_results publishes or raises its PublishError, never another exception."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pubswap_flwr.cli import main as pubswap
from tests.unit.test_report_files import make_run
from tests.unit.test_report_publish import _finished_sweep, _script
from tests.unit.test_run_files_boundary import Fifo, fake_run

QUICK = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**400, max_value=10**400),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)


def _paths(value, prefix=()):
    """Every place in a JSON value: (path, value)."""
    yield prefix, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        yield from _paths(inner, prefix + (key,))


def _replaced(value, path, new):
    if not path:
        return new
    value[path[0]] = _replaced(value[path[0]], path[1:], new)
    return value


@st.composite
def damage(draw):
    """How a file is spoiled: ("bytes", b), ("truncated", fraction), ("types", choice, value), ("link",), ("fifo",)."""
    kind = draw(st.sampled_from(["bytes", "truncated", "types", "types", "link", "fifo"]))
    if kind == "bytes":
        return kind, draw(st.binary(max_size=200))
    if kind == "truncated":
        return kind, draw(st.floats(min_value=0.0, max_value=0.99))
    if kind == "types":
        return kind, draw(st.integers(min_value=0, max_value=10**6)), draw(json_values)
    return (kind,)


def _spoil(path: Path, how: tuple, fifos: list) -> None:
    good = path.read_bytes() if path.exists() else b"{}"
    if how[0] == "bytes":
        path.write_bytes(how[1])
    elif how[0] == "truncated":
        path.write_bytes(good[:int(len(good) * how[1])])
    elif how[0] == "types":
        lines = good.decode("utf-8", "replace").splitlines() or ["{}"]
        number = how[1] % len(lines)
        try:
            value = json.loads(lines[number])
        except ValueError:
            value = {}
        places = list(_paths(value))
        where, _ = places[how[1] % len(places)]
        lines[number] = json.dumps(_replaced(value, where, how[2]))
        path.write_text("\n".join(lines) + "\n")
    elif how[0] == "link":
        target = path.parent / f".{path.name}.target"
        target.write_bytes(good)
        path.unlink(missing_ok=True)
        path.symlink_to(target)
    else:
        fifos.append(Fifo(path, good))


def _cli(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = pubswap(args)
    return code, err.getvalue().strip()


def _answered_or_one_line(code: int, err: str, command: str) -> None:
    """Exit 0, or exit 2 with one error line, after at most the command's own progress lines (`verify [3 s]: ...`:
    a run whose files pass the checks gets as far as loading the model before its adapter is refused)."""
    assert code in (0, 2), (code, err)
    if code == 2:
        *progress, last = err.splitlines()
        assert last.startswith(f"pubswap {command}: ") and "Traceback" not in err, err
        assert all(re.match(rf"{command} \[\d+ s\]: ", line) for line in progress), err


@QUICK
@given(name=st.sampled_from(["config.json", "metrics.jsonl", "adapters/final/adapter_config.json",
                             "adapters/final/adapter_model.safetensors"]), how=damage())
@example(name="metrics.jsonl", how=("truncated", 0.99))  # only the last newline cut: the files pass, the adapter not
def test_verify_answers_or_prints_one_line_whatever_a_file_holds(name, how):
    fifos: list = []
    with tempfile.TemporaryDirectory() as tmp:
        run = fake_run(Path(tmp))
        _spoil(run / name, how, fifos)
        code, err = _cli(["verify", str(run), "--items-per-task", "1"])
        assert not any(f.close() for f in fifos)  # no FIFO was opened
    _answered_or_one_line(code, err, "verify")
    assert code == 2  # the fake run's adapter is never the model's


@QUICK
@given(name=st.sampled_from(["metrics.jsonl", "status.json", "config.json", "provenance.json"]), how=damage())
def test_report_answers_or_prints_one_line_whatever_a_file_holds(name, how):
    fifos: list = []
    with tempfile.TemporaryDirectory() as tmp:
        run = make_run(Path(tmp), "fedavg", 0, 0.3)
        (run / "status.json").write_text(json.dumps({"status": "completed", "elapsed_s": 6.0}))
        (run / "config.json").write_text(json.dumps({"config": {"generation.temperature": 1.0}}))
        (run / "provenance.json").write_text(json.dumps({"starts": [{"code": {"commit": "abc"}, "version": "1"}]}))
        _spoil(run / name, how, fifos)
        code, err = _cli(["report", str(run), "--out", str(Path(tmp) / "out")])
        assert not any(f.close() for f in fifos)
        assert (code == 0) == (Path(tmp) / "out" / "report.md").is_file()
    _answered_or_one_line(code, err, "report")


@pytest.fixture(scope="module")
def publication(tmp_path_factory):
    """A finished mini sweep with a final adapter, and its publication: made once, copied by every example."""
    import numpy as np
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("publication")
    sweep, results = _finished_sweep(root)
    final = results / "mini-sweep" / "runs" / "fedavg-s0" / "adapters" / "final"
    final.mkdir(parents=True)
    (final / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "embedded:tiny"}))
    save_file({"x": np.zeros(2, np.float32)}, str(final / "adapter_model.safetensors"))
    _script().publish(sweep, results, docs=root / "docs")
    return root


@QUICK
@given(name=st.sampled_from(["outcomes.json", "runs/fedavg-s0/metrics.jsonl", "runs/fedavg-s1/config.json",
                             "runs/fedprox-s0/status.json", "runs/fedprox-s1/provenance.json",
                             "runs/fedavg-s0/adapters/final/adapter_config.json",
                             "runs/fedavg-s0/adapters/final/adapter_model.safetensors"]), how=damage())
def test_publish_publishes_or_raises_its_error_whatever_a_file_holds(publication, name, how):
    script = _script()
    fifos: list = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "copy"
        shutil.copytree(publication, root, symlinks=True)
        sweep, results, docs = root / "mini-sweep.toml", root / "results", root / "docs"
        published = docs / "mini-sweep"
        before = {p: p.read_bytes() for p in published.rglob("*") if p.is_file()}
        assert "report.md" in {p.name for p in before}
        _spoil(results / "mini-sweep" / name, how, fifos)
        try:
            script.publish(sweep, results, docs=docs, force=True)
        except script.PublishError:  # the old publication stays as it was
            assert {p: p.read_bytes() for p in published.rglob("*") if p.is_file()} == before
        assert not any(f.close() for f in fifos)
