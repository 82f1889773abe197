"""Tests of the ``topas`` command line (topas/cli.py) and the result format (topas/results.py).

Bad input must give exit status 2, one line ``topas: error: ...`` on stderr, no
traceback and no output file (cli.py module docstring, DESIGN.md "Interfaces").
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from topas.cli import main
from topas.instance import FORMAT, load_instance
from topas.policies import BASELINES

SUMMARY_KEYS = (
    "mean_jct",
    "p50_jct",
    "p90_jct",
    "p99_jct",
    "max_jct",
    "makespan",
    "prefix_hit_rate",
    "prefix_loads",
    "preemptions",
    "decision_time_p50_s",
    "decision_time_p99_s",
)
WALL_CLOCK_SUMMARY_KEYS = ("decision_time_p50_s", "decision_time_p99_s")

# --------------------------------------------------------------------------- instances


def step_doc() -> dict[str, Any]:
    """Three small tasks under the step model: runs in a few milliseconds."""
    return {
        "format": FORMAT,
        "name": "cli-step",
        "server": {
            "kv_capacity_tokens": 400,
            "max_running": 4,
            "chunk_tokens": 64,
            "cost_model": {"kind": "step", "step_s": 1.0},
            "prefix_load": {"kind": "recompute"},
        },
        "agents": [{"id": "a", "prefix_tokens": 50}, {"id": "b", "prefix_tokens": 80}],
        "tasks": [
            {
                "id": "t0",
                "arrival": 0,
                "stages": [
                    {"id": "s1", "agent": "a", "input_tokens": 10, "output_tokens": 3},
                    {
                        "id": "s2",
                        "agent": "b",
                        "input_tokens": 20,
                        "output_tokens": 2,
                        "deps": ["s1"],
                        "predicted_output_tokens": 4,
                    },
                    {
                        "id": "s3",
                        "agent": "a",
                        "input_tokens": 70,
                        "output_tokens": 5,
                        "deps": ["s1"],
                    },
                ],
            },
            {
                "id": "t1",
                "arrival": 1.5,
                "stages": [{"id": "s1", "agent": "b", "input_tokens": 10, "output_tokens": 4}],
            },
            {
                "id": "t2",
                "arrival": 2,
                "workflow": "w",
                "stages": [
                    {"id": "x", "agent": "a", "input_tokens": 130, "output_tokens": 6},
                    {
                        "id": "y",
                        "agent": "b",
                        "input_tokens": 10,
                        "output_tokens": 1,
                        "deps": ["x"],
                    },
                ],
            },
        ],
    }


def calibrated_doc() -> dict[str, Any]:
    """The same workload under a linear (calibrated) cost model with host loads."""
    doc = step_doc()
    doc["name"] = "cli-calibrated"
    doc["server"]["cost_model"] = {
        "kind": "linear",
        "base_s": 0.005,
        "prefill_token_s": 2.5e-5,
        "decode_seq_s": 2e-5,
        "kv_token_s": 4e-8,
    }
    doc["server"]["prefix_load"] = {"kind": "host", "tokens_per_s": 20000}
    return doc


def _write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc, indent=1))
    return path


@pytest.fixture
def step_file(tmp_path: Path) -> Path:
    return _write(tmp_path / "step.json", step_doc())


@pytest.fixture
def calibrated_file(tmp_path: Path) -> Path:
    return _write(tmp_path / "calibrated.json", calibrated_doc())


def _bad_invalid_json(path: Path) -> None:
    path.write_text(json.dumps(step_doc(), indent=1)[:200])


def _bad_format(path: Path) -> None:
    _write(path, dict(step_doc(), format="topas-instance/9"))


def _bad_dangling(path: Path) -> None:
    doc = step_doc()
    doc["tasks"][0]["stages"][1]["deps"] = ["s1", "ghost"]
    _write(path, doc)


def _bad_cycle(path: Path) -> None:
    doc = step_doc()
    doc["tasks"][2]["stages"][0]["deps"] = ["y"]
    _write(path, doc)


def _bad_unfitting(path: Path) -> None:
    doc = step_doc()
    doc["tasks"][1]["stages"][0]["output_tokens"] = 400
    _write(path, doc)


def _bad_missing(path: Path) -> None:
    pass  # no file at all


def _bad_empty(path: Path) -> None:
    path.write_text("")


BAD_INSTANCES = {
    "invalid-json": (_bad_invalid_json, "line"),
    "unknown-format": (_bad_format, "'topas-instance/9'"),
    "dangling-dep": (_bad_dangling, "tasks[t0].stages[s2].deps"),
    "cycle": (_bad_cycle, "tasks[t2].stages"),
    "unfitting-stage": (_bad_unfitting, "tasks[t1].stages[s1]"),
    "missing-file": (_bad_missing, "missing.json"),
    "empty-file": (_bad_empty, "line 1"),
}


# --------------------------------------------------------------------------- helpers


def run(capsys: pytest.CaptureFixture[str], *args: str | os.PathLike[str]) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, out: str, err: str, *fragments: str) -> str:
    assert rc == 2, (rc, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    line = lines[0]
    assert line.startswith("topas: error: "), line
    assert "Traceback" not in err
    assert out == "", f"nothing expected on stdout, got {out!r}"
    for frag in fragments:
        assert frag in line, f"{frag!r} not in {line!r}"
    return line


def read_result(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def reproducible(doc: dict[str, Any]) -> dict[str, Any]:
    """The result without its wall-clock figures."""
    doc = json.loads(json.dumps(doc))
    doc.pop("wall_clock", None)
    for k in WALL_CLOCK_SUMMARY_KEYS:
        doc["summary"].pop(k, None)
    return doc


def table_rows(out: str) -> list[list[str]]:
    """The data rows of a printed table (after the header and the dashes)."""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    dash = next(i for i, ln in enumerate(lines) if set(ln.replace(" ", "")) == {"-"})
    return [ln.split() for ln in lines[dash + 1 :]]


# --------------------------------------------------------------------------- malformed instances


@pytest.mark.parametrize("case", list(BAD_INSTANCES))
def test_simulate_rejects_a_bad_instance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    make, fragment = BAD_INSTANCES[case]
    bad = tmp_path / ("missing.json" if case == "missing-file" else f"{case}.json")
    make(bad)
    out_file = tmp_path / "R.json"
    rc, out, err = run(capsys, "simulate", bad, "--policy", "fcfs", "--out", out_file)
    assert_one_line_error(rc, out, err, str(bad), fragment)
    assert not out_file.exists()
    assert sorted(os.listdir(tmp_path)) == ([] if case == "missing-file" else [bad.name])


@pytest.mark.parametrize("case", list(BAD_INSTANCES))
def test_compare_rejects_a_bad_instance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    make, fragment = BAD_INSTANCES[case]
    bad = tmp_path / ("missing.json" if case == "missing-file" else f"{case}.json")
    make(bad)
    csv_file = tmp_path / "C.csv"
    rc, out, err = run(capsys, "compare", bad, "--csv", csv_file)
    assert_one_line_error(rc, out, err, str(bad), fragment)
    assert not csv_file.exists()
    rc, out, err = run(capsys, "compare", bad)
    assert_one_line_error(rc, out, err, str(bad), fragment)


def test_bad_instance_is_reported_before_a_bad_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    _bad_dangling(bad)
    rc, out, err = run(capsys, "simulate", bad, "--policy", "nope", "--out", tmp_path / "R.json")
    assert_one_line_error(rc, out, err, str(bad))


# --------------------------------------------------------------------------- bad policies

BAD_POLICIES = {
    "nope": ("unknown policy", "'nope'"),
    "lpm:foo=1": ("'foo'", "max_sorted"),
    "lpm:max_sorted=abc": ("max_sorted", "'abc'"),
    "lpm:max_sorted": ("key=value",),
    "pkg.that.does.not.exist:Cls": ("pkg.that.does.not.exist",),
    "topas.policies:NoSuchClass": ("NoSuchClass",),
    "topas.policies.baselines": ("package.module:Class",),
}


@pytest.mark.parametrize("spec", list(BAD_POLICIES))
def test_simulate_rejects_a_bad_policy(
    tmp_path: Path, step_file: Path, capsys: pytest.CaptureFixture[str], spec: str
) -> None:
    out_file = tmp_path / "R.json"
    rc, out, err = run(capsys, "simulate", step_file, "--policy", spec, "--out", out_file)
    assert_one_line_error(rc, out, err, *BAD_POLICIES[spec])
    assert not out_file.exists()
    assert os.listdir(tmp_path) == [step_file.name]


@pytest.mark.parametrize("spec", list(BAD_POLICIES))
def test_compare_rejects_a_bad_policy_before_running_any(
    tmp_path: Path, step_file: Path, capsys: pytest.CaptureFixture[str], spec: str
) -> None:
    csv_file = tmp_path / "C.csv"
    rc, out, err = run(
        capsys, "compare", step_file, "--policies", f"fcfs,{spec}", "--csv", csv_file
    )
    assert_one_line_error(rc, out, err, *BAD_POLICIES[spec])
    assert not csv_file.exists()


def test_compare_with_no_policies(
    tmp_path: Path, step_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(
        capsys, "compare", step_file, "--policies", " , ", "--csv", tmp_path / "C.csv"
    )
    assert_one_line_error(rc, out, err, "--policies")
    assert not (tmp_path / "C.csv").exists()


def test_argparse_usage_errors_exit_2(step_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["simulate", str(step_file), "--out", "x.json"],  # no --policy
        ["simulate", str(step_file), "--policy", "fcfs", "--timing", "bogus", "--out", "x.json"],
        ["frobnicate"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert "Traceback" not in capsys.readouterr().err


def test_policies_lists_the_baselines(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "policies")
    assert rc == 0
    assert set(BASELINES) <= set(out.split())


# --------------------------------------------------------------------------- subprocess


def _subprocess(*args: str | os.PathLike[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "topas.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
    )


def test_subprocess_bad_instance_exit_status(tmp_path: Path) -> None:
    bad = tmp_path / "cycle.json"
    _bad_cycle(bad)
    res = _subprocess(
        "simulate", bad, "--policy", "fcfs", "--out", tmp_path / "R.json", cwd=tmp_path
    )
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith("topas: error: ")
    assert str(bad) in res.stderr and "cycle" in res.stderr
    assert "Traceback" not in res.stderr
    assert res.stdout == ""
    assert not (tmp_path / "R.json").exists()


def test_subprocess_bad_policy_exit_status(tmp_path: Path, step_file: Path) -> None:
    res = _subprocess(
        "compare",
        step_file,
        "--policies",
        "fcfs,lpm:max_sorted=abc",
        "--csv",
        tmp_path / "C.csv",
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith("topas: error: ")
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "C.csv").exists()


def test_subprocess_valid_run(tmp_path: Path, step_file: Path) -> None:
    res = _subprocess(
        "simulate", step_file, "--policy", "lpm", "--out", tmp_path / "R.json", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    assert read_result(tmp_path / "R.json")["format"] == "topas-result/1"


# --------------------------------------------------------------------------- valid simulate


def test_simulate_writes_a_result_document(
    tmp_path: Path, step_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "results" / "R.json"
    rc, out, err = run(capsys, "simulate", step_file, "--policy", "fcfs", "--out", out_file)
    assert rc == 0, err
    assert err == ""
    doc = read_result(out_file)
    for key in ("format", "instance", "policy", "seed", "timing", "version", "summary", "jct"):
        assert key in doc, key
    assert doc["format"] == "topas-result/1"
    inst = load_instance(step_file)
    assert doc["instance"] == {"name": "cli-step", "hash": inst.content_hash}
    assert doc["policy"] == "fcfs"
    assert doc["seed"] == 0
    assert doc["timing"] == "step"  # the file's cost model is the step model
    assert doc["version"] == version("topas")
    summary = doc["summary"]
    for key in SUMMARY_KEYS:
        assert isinstance(summary[key], int | float), key
    assert summary["objective_steps"] == round(sum(doc["jct"].values()))
    jct = doc["jct"]
    assert set(jct) == {"t0", "t1", "t2"}
    assert all(v > 0 for v in jct.values())
    assert summary["max_jct"] == max(jct.values())
    assert summary["mean_jct"] == pytest.approx(sum(jct.values()) / 3)
    assert summary["p50_jct"] <= summary["p90_jct"] <= summary["p99_jct"] <= summary["max_jct"]
    assert summary["makespan"] >= summary["max_jct"]
    assert 0.0 <= summary["prefix_hit_rate"] <= 1.0
    assert summary["prefix_loads"] >= 2  # two agents, nothing resident at the start
    assert summary["preemptions"] == 0
    assert "schedule" not in doc
    # The file is exactly one JSON document plus a newline.
    assert out_file.read_text().endswith("}\n")
    rows = table_rows(out)
    assert len(rows) == 1 and rows[0][0] == "fcfs"
    assert os.listdir(out_file.parent) == ["R.json"]


def test_simulate_step_model_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One stage, step_s 0.5: release ceil(0.7/0.5)=2, load ceil(50/64)=1, run 1+3=4 steps."""
    doc = {
        "format": FORMAT,
        "name": "one",
        "server": {
            "kv_capacity_tokens": 400,
            "chunk_tokens": 64,
            "cost_model": {"kind": "step", "step_s": 0.5},
        },
        "agents": [{"id": "a", "prefix_tokens": 50}],
        "tasks": [
            {
                "id": "t0",
                "arrival": 0.7,
                "stages": [{"id": "s1", "agent": "a", "input_tokens": 10, "output_tokens": 3}],
            }
        ],
    }
    path = _write(tmp_path / "one.json", doc)
    rc, _, err = run(
        capsys,
        "simulate",
        path,
        "--policy",
        "fcfs",
        "--out",
        tmp_path / "R.json",
        "--with-schedule",
    )
    assert rc == 0, err
    res = read_result(tmp_path / "R.json")
    assert res["jct"] == {"t0": 2.5}  # 5 steps of 0.5 s
    assert res["summary"]["objective_steps"] == 5
    (stage_run,) = res["schedule"]["runs"]
    assert (stage_run["start"], stage_run["end"]) == (1.5, 3.5)
    (prefix,) = res["schedule"]["prefixes"]
    assert (prefix["agent"], prefix["load_start"], prefix["resident_from"]) == ("a", 1.0, 1.5)


def test_simulate_calibrated_by_default_for_a_linear_model(
    tmp_path: Path, calibrated_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = run(
        capsys, "simulate", calibrated_file, "--policy", "lpm", "--out", tmp_path / "R.json"
    )
    assert rc == 0, err
    doc = read_result(tmp_path / "R.json")
    assert doc["timing"] == "calibrated"
    assert "objective_steps" not in doc["summary"]
    assert set(doc["jct"]) == {"t0", "t1", "t2"}


def test_simulate_timing_step_overrides_the_file(
    tmp_path: Path, calibrated_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(
        capsys,
        "simulate",
        calibrated_file,
        "--policy",
        "fcfs",
        "--timing",
        "step",
        "--out",
        tmp_path / "R.json",
    )
    assert rc == 0, err
    doc = read_result(tmp_path / "R.json")
    assert doc["timing"] == "step"
    steps = doc["summary"]["objective_steps"]
    assert isinstance(steps, int) and steps > 0
    # step_s = base_s when --timing step overrides a linear model (DESIGN rule 1)
    assert sum(doc["jct"].values()) == pytest.approx(steps * 0.005)
    assert "sum JCT (steps)" in out


def test_simulate_timing_calibrated_overrides_a_step_file(
    tmp_path: Path, step_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(
        capsys,
        "simulate",
        step_file,
        "--policy",
        "fcfs",
        "--timing",
        "calibrated",
        "--out",
        tmp_path / "R.json",
    )
    assert rc == 0, err
    doc = read_result(tmp_path / "R.json")
    assert doc["timing"] == "calibrated"
    assert "objective_steps" not in doc["summary"]
    assert "sum JCT (steps)" not in out


@pytest.mark.parametrize("which", ["step", "calibrated"])
@pytest.mark.parametrize("policy", ["fcfs", "kvflow"])
def test_same_seed_same_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str, policy: str
) -> None:
    path = _write(tmp_path / "i.json", step_doc() if which == "step" else calibrated_doc())
    docs = []
    for name in ("A.json", "B.json"):
        rc, _, err = run(
            capsys,
            "simulate",
            path,
            "--policy",
            policy,
            "--seed",
            "7",
            "--out",
            tmp_path / name,
            "--with-schedule",
        )
        assert rc == 0, err
        docs.append(read_result(tmp_path / name))
    a, b = docs
    assert a["seed"] == 7
    assert reproducible(a) == reproducible(b)
    # Only the documented wall-clock fields were removed.
    assert set(a) - set(reproducible(a)) == {"wall_clock"}
    assert set(a["summary"]) - set(reproducible(a)["summary"]) == set(WALL_CLOCK_SUMMARY_KEYS)


def test_wall_clock_fields_are_apart(
    tmp_path: Path, step_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = run(
        capsys, "simulate", step_file, "--policy", "fcfs", "--out", tmp_path / "R.json"
    )
    assert rc == 0, err
    doc = read_result(tmp_path / "R.json")
    wall = doc["wall_clock"]
    assert wall["runtime_s"] >= 0 and wall["policy_calls"] >= 1
    assert wall["decision_time_p50_s"] == doc["summary"]["decision_time_p50_s"]
    assert wall["decision_time_p99_s"] == doc["summary"]["decision_time_p99_s"]


def test_with_schedule(tmp_path: Path, step_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(
        capsys,
        "simulate",
        step_file,
        "--policy",
        "cpf",
        "--with-schedule",
        "--out",
        tmp_path / "R.json",
    )
    assert rc == 0, err
    doc = read_result(tmp_path / "R.json")
    sched = doc["schedule"]
    assert set(sched) >= {"runs", "prefixes"}
    done = [(r["task"], r["stage"]) for r in sched["runs"] if not r["preempted"]]
    inst = load_instance(step_file)
    assert sorted(done) == sorted((t.id, s.id) for t in inst.tasks for s in t.stages)
    for r in sched["runs"]:
        assert set(r) >= {"task", "stage", "agent", "admit", "start", "end"}
        assert r["admit"] <= r["start"] <= r["end"]
    assert {p["agent"] for p in sched["prefixes"]} == {"a", "b"}
    for p in sched["prefixes"]:
        assert p["load_start"] <= p["resident_from"] <= p["end"]
    # JCT = last end of the task's stages minus its release (integral arrivals stay put).
    ends: dict[str, float] = {}
    for r in sched["runs"]:
        if not r["preempted"]:
            ends[r["task"]] = max(ends.get(r["task"], 0.0), r["end"])
    release = {"t0": 0.0, "t1": 2.0, "t2": 2.0}  # ceil(1.5) = 2 with step_s = 1
    assert doc["jct"] == pytest.approx({t: ends[t] - release[t] for t in ends})


def test_result_hash_ignores_formatting_of_the_instance_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps(step_doc()))
    b.write_text(json.dumps(step_doc(), indent=4, sort_keys=True))
    hashes = []
    for path in (a, b):
        rc, _, err = run(
            capsys, "simulate", path, "--policy", "fcfs", "--out", tmp_path / f"R-{path.stem}.json"
        )
        assert rc == 0, err
        hashes.append(read_result(tmp_path / f"R-{path.stem}.json")["instance"]["hash"])
    assert hashes[0] == hashes[1] == load_instance(a).content_hash


# --------------------------------------------------------------------------- compare


def test_compare_prints_one_row_per_policy(
    step_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(capsys, "compare", step_file)
    assert rc == 0, err
    rows = table_rows(out)
    assert [r[0] for r in rows] == list(BASELINES)
    header = out.splitlines()[0]
    assert header.split()[0] == "policy" and "sum JCT (steps)" in header


def test_compare_csv(tmp_path: Path, step_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    specs = ["fcfs", "lpm:max_sorted=1", "atlas"]
    csv_file = tmp_path / "out" / "C.csv"
    rc, out, err = run(
        capsys,
        "compare",
        step_file,
        "--policies",
        ",".join(specs),
        "--csv",
        csv_file,
        "--seed",
        "3",
    )
    assert rc == 0, err
    assert [r[0] for r in table_rows(out)] == specs
    rows = list(csv.reader(io.StringIO(csv_file.read_text())))
    header, body = rows[0], rows[1:]
    assert header[0] == "policy"
    assert {"mean_jct", "p99_jct", "makespan", "prefix_hit_rate"} <= set(header)
    assert [r[0] for r in body] == specs
    assert all(len(r) == len(header) for r in body)
    # The CSV agrees with simulate on the same instance, policy and seed.
    rc, _, err = run(
        capsys,
        "simulate",
        step_file,
        "--policy",
        "fcfs",
        "--seed",
        "3",
        "--out",
        tmp_path / "R.json",
    )
    assert rc == 0, err
    summary = read_result(tmp_path / "R.json")["summary"]
    fcfs = dict(zip(header, body[0], strict=True))
    for key in ("mean_jct", "p50_jct", "max_jct", "makespan", "prefix_hit_rate"):
        assert float(fcfs[key]) == pytest.approx(summary[key]), key
    assert int(fcfs["prefix_loads"]) == summary["prefix_loads"]
    assert int(fcfs["objective_steps"]) == summary["objective_steps"]


def test_compare_calibrated_table_has_no_step_column(
    calibrated_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(capsys, "compare", calibrated_file, "--policies", "fcfs,cpf")
    assert rc == 0, err
    assert [r[0] for r in table_rows(out)] == ["fcfs", "cpf"]
    assert "sum JCT (steps)" not in out


# --------------------------------------------------------------------------- user policies

USER_MODULE = '''
from dataclasses import dataclass

from topas.policies import Policy, admit_in_order
from topas.policies.baselines import fcfs_order

CREATED = []


@dataclass
class MyFCFS(Policy):
    """FCFS written by a user, outside the package."""

    param: int = 0
    ratio: float = 0.5
    verbose: bool = False

    def __post_init__(self):
        CREATED.append((self.param, self.ratio, self.verbose))

    def decide(self, state):
        return admit_in_order(state, fcfs_order(state), self.eviction_order(state)).decision()


@dataclass
class NeedsParam(Policy):
    """A policy with a required parameter."""

    k: int

    def decide(self, state):
        return admit_in_order(state, fcfs_order(state), self.eviction_order(state)).decision()


class NotAPolicy:
    pass
'''


USER_PACKAGE = "topas_test_userpkg"


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """``topas_test_userpkg.policy`` (a package.module, as DESIGN.md spells it) on sys.path."""
    root = tmp_path / "site"
    pkg = root / USER_PACKAGE
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "policy.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(root))
    names = (USER_PACKAGE, f"{USER_PACKAGE}.policy")
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield f"{USER_PACKAGE}.policy"
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture
def top_level_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The same policy in a top-level module ``topas_test_user_policy`` (no package)."""
    name = "topas_test_user_policy"
    root = tmp_path / "site1"
    root.mkdir()
    (root / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, name, raising=False)
    yield name
    sys.modules.pop(name, None)


def test_user_policy_class(
    tmp_path: Path, step_file: Path, user_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"{user_module}:MyFCFS"
    rc, out, err = run(
        capsys, "simulate", step_file, "--policy", spec, "--out", tmp_path / "U.json"
    )
    assert rc == 0, err
    user = read_result(tmp_path / "U.json")
    assert user["policy"] == spec
    assert table_rows(out)[0][0] == spec
    rc, _, err = run(
        capsys, "simulate", step_file, "--policy", "fcfs", "--out", tmp_path / "F.json"
    )
    assert rc == 0, err
    fcfs = read_result(tmp_path / "F.json")
    assert user["jct"] == fcfs["jct"]
    assert reproducible(user)["summary"] == reproducible(fcfs)["summary"]


def test_user_policy_with_parameters(
    tmp_path: Path, step_file: Path, user_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"{user_module}:MyFCFS:param=3,ratio=0.25,verbose=true"
    rc, _, err = run(capsys, "simulate", step_file, "--policy", spec, "--out", tmp_path / "U.json")
    assert rc == 0, err
    assert read_result(tmp_path / "U.json")["policy"] == spec
    created = sys.modules[user_module].CREATED
    assert created and set(created) == {(3, 0.25, True)}


def test_user_policy_in_compare(
    tmp_path: Path, step_file: Path, user_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"{user_module}:MyFCFS:param=3"
    rc, out, err = run(
        capsys, "compare", step_file, "--policies", f"fcfs,{spec}", "--csv", tmp_path / "C.csv"
    )
    assert rc == 0, err
    assert [r[0] for r in table_rows(out)] == ["fcfs", spec]
    body = list(csv.reader(io.StringIO((tmp_path / "C.csv").read_text())))[1:]
    assert body[0][1:] == body[1][1:]  # same schedule as the built-in FCFS


@pytest.mark.parametrize(
    "suffix,fragments",
    [
        (":MyFCFS:nope=1", ("'nope'", "param")),
        (":MyFCFS:param=x", ("param", "'x'")),
        (":MyFCFS:verbose=maybe", ("verbose", "'maybe'")),
        (":NotAPolicy", ("NotAPolicy",)),
        (":Missing", ("Missing",)),
        ("", ("package.module:Class",)),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_user_policy_bad_spec(
    tmp_path: Path,
    step_file: Path,
    user_module: str,
    capsys: pytest.CaptureFixture[str],
    suffix: str,
    fragments: tuple[str, ...],
) -> None:
    out_file = tmp_path / "U.json"
    spec = f"{user_module}{suffix}" if suffix else user_module
    rc, out, err = run(capsys, "simulate", step_file, "--policy", spec, "--out", out_file)
    assert_one_line_error(rc, out, err, *fragments)
    assert not out_file.exists()


def test_user_policy_with_a_required_parameter(
    tmp_path: Path, step_file: Path, user_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = run(
        capsys,
        "simulate",
        step_file,
        "--policy",
        f"{user_module}:NeedsParam:k=2",
        "--out",
        tmp_path / "U.json",
    )
    assert rc == 0, err


# --------------------------------------------------------------------------- known problems


def test_user_policy_missing_a_required_parameter(
    tmp_path: Path, step_file: Path, user_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "U.json"
    rc, out, err = run(
        capsys, "simulate", step_file, "--policy", f"{user_module}:NeedsParam", "--out", out_file
    )
    assert_one_line_error(rc, out, err, "NeedsParam", "'k'")
    assert not out_file.exists()


def test_user_policy_in_a_top_level_module(
    tmp_path: Path, step_file: Path, top_level_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"{top_level_module}:MyFCFS:param=3"
    rc, _, err = run(capsys, "simulate", step_file, "--policy", spec, "--out", tmp_path / "U.json")
    assert rc == 0, err
    assert read_result(tmp_path / "U.json")["policy"] == spec
    assert set(sys.modules[top_level_module].CREATED) == {(3, 0.5, False)}


def test_out_path_that_is_a_directory(
    tmp_path: Path, step_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "somedir"
    target.mkdir()
    rc, out, err = run(capsys, "simulate", step_file, "--policy", "fcfs", "--out", target)
    assert rc == 2
    assert len(err.splitlines()) == 1 and err.startswith("topas: error:")
    assert str(target) in err
    assert sorted(os.listdir(tmp_path)) == sorted([step_file.name, "somedir"])


def test_instance_with_no_tasks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "empty-tasks.json", dict(step_doc(), tasks=[]))
    out_file = tmp_path / "R.json"
    rc, out, err = run(capsys, "simulate", path, "--policy", "fcfs", "--out", out_file)
    if rc == 0:  # acceptable fix: an empty run
        assert read_result(out_file)["jct"] == {}
    else:  # acceptable fix: rejected at validation, naming file and field
        assert_one_line_error(rc, out, err, str(path), "tasks")
        assert not out_file.exists()


# --------------------------------------------------------------------------- generate


@pytest.fixture
def workloads():  # type: ignore[no-untyped-def]
    import topas.workloads  # an import error fails the tests that use it, never skips them

    return topas.workloads


def test_generate_chain(tmp_path: Path, workloads: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "gen" / "chain.json"
    rc, out, err = run(capsys, "generate", "chain", "--tasks", "5", "-o", out_file)
    assert rc == 0, err
    inst = load_instance(out_file)
    assert len(inst.tasks) == 5
    assert json.loads(out_file.read_text())["format"] == FORMAT
    assert str(out_file) in out
    # Same arguments, same instance.
    again = tmp_path / "again.json"
    rc, _, err = run(capsys, "generate", "chain", "--tasks", "5", "-o", again)
    assert rc == 0, err
    assert again.read_text() == out_file.read_text()


def test_generate_then_simulate(
    tmp_path: Path, workloads: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    inst_file = tmp_path / "chain.json"
    rc, _, err = run(
        capsys, "generate", "chain", "--tasks", "5", "--timing", "step", "-o", inst_file
    )
    assert rc == 0, err
    rc, _, err = run(
        capsys, "simulate", inst_file, "--policy", "fcfs", "--out", tmp_path / "R.json"
    )
    assert rc == 0, err
    doc = read_result(tmp_path / "R.json")
    assert doc["timing"] == "step"
    assert len(doc["jct"]) == 5


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["no-such-workload"], ("no-such-workload",)),
        (["chain", "--param", "no_such_param=1"], ("no_such_param",)),
        (["chain", "--param", "novalue"], ("--param", "novalue")),
    ],
)
def test_generate_bad_arguments(
    tmp_path: Path,
    workloads: Any,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    fragments: tuple[str, ...],
) -> None:
    out_file = tmp_path / "F.json"
    rc, out, err = run(capsys, "generate", *args, "--tasks", "5", "-o", out_file)
    assert_one_line_error(rc, out, err, *fragments)
    assert not out_file.exists()
    assert os.listdir(tmp_path) == []


def test_demo_prints_topas_beside_every_baseline_and_its_cut(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from topas.cli import main
    from topas.policies import BASELINES

    assert main(["demo", "--tasks", "12", "--load", "0.9"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("workload metagpt-sop")
    table = lines[3 : 3 + len(BASELINES) + 1]  # after the header and its rule
    rows = {line.split()[0]: line.split() for line in table}
    for name in (*BASELINES, "topas"):
        assert name in rows, name
    # the cut lines name the best baseline per metric, from the table's own numbers
    for label, col in (("mean JCT", 1), ("p99 JCT", 4)):
        line = next(x for x in lines if x.startswith(f"topas {label}:"))
        best = min(BASELINES, key=lambda b: float(rows[b][col]))
        assert f"({best})" in line and line.endswith(("faster", "slower"))


def test_demo_cut_is_against_the_best_baseline_per_metric() -> None:
    import dataclasses

    from topas.cli import demo_cuts
    from topas.schedule import Metrics

    def m(mean: float, p99: float) -> Metrics:
        zero = {f.name: 0 for f in dataclasses.fields(Metrics) if f.name != "jct"}
        return Metrics(jct={}, **{**zero, "mean_jct": mean, "p99_jct": p99})

    rows = [("lpm", m(10.0, 40.0)), ("spf", m(8.0, 50.0)), ("topas", m(6.0, 44.0))]
    rows += [(b, m(99.0, 99.0)) for b in ("fcfs", "cpf", "atlas", "kvflow", "parrot-fcfs", "las")]
    assert demo_cuts(rows) == [
        "topas mean JCT: 6.0 s against the best baseline's 8.0 s (spf): 25.0% faster",
        "topas p99 JCT: 44.0 s against the best baseline's 40.0 s (lpm): 10.0% slower",
    ]


def test_simulate_prediction_error(
    tmp_path: Path, calibrated_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    args = ["--policy", "topas", "--prediction-error", "0.5", "--seed", "2", "--no-progress"]
    assert run(capsys, "simulate", calibrated_file, *args, "--out", a)[0] == 0
    assert run(capsys, "simulate", calibrated_file, *args, "--out", b)[0] == 0
    doc = read_result(a)
    assert doc["prediction_error"] == 0.5
    assert reproducible(doc) == reproducible(read_result(b))
    plain = tmp_path / "plain.json"
    assert run(capsys, "simulate", calibrated_file, "--policy", "topas", "--out", plain)[0] == 0
    assert "prediction_error" not in read_result(plain)
    for bad in ("-1", "nan"):
        rc, out, err = run(
            capsys, "compare", calibrated_file, "--prediction-error", bad, "--no-progress"
        )
        assert_one_line_error(rc, out, err, "--prediction-error")


def test_an_internal_error_is_not_reported_as_bad_input(
    tmp_path: Path, calibrated_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    # a ValueError from deep inside the engine is a bug, not bad input: its own status
    # (70, EX_SOFTWARE), a message that says so, a request to report it, no output file;
    # bad input keeps status 2 and one line
    import topas.cli as cli
    import topas.runs

    def broken(*args: Any, **kw: Any) -> None:
        raise ValueError("kv_committed went negative")

    monkeypatch.setattr(topas.runs, "simulate", broken)
    out_file = tmp_path / "r.json"
    rc = cli.main(["simulate", str(calibrated_file), "--policy", "lpm", "--out", str(out_file)])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_SOFTWARE == 70
    assert err.startswith("topas: internal error: ValueError: kv_committed went negative\n")
    assert "Please report it" in err and not out_file.exists()
    rc = cli.main(["simulate", str(calibrated_file), "--policy", "nope", "--out", str(out_file)])
    assert rc == 2 and capsys.readouterr().err.count("\n") == 1
