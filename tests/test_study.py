"""The study framework (topas/studies/__init__.py)."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topas.errors import InputError
from topas.studies import cell, md_table, rows_to_csv, run_jobs, write_outputs
from topas.studies.checkpoint import CHECKPOINT_NAME, Checkpoint, job_key
from topas.studies.gap import GapConfig


def _square(x: int) -> int:
    return x * x


def test_run_jobs_keeps_the_order_of_the_jobs():
    assert run_jobs(_square, [3, 1, 2], n_jobs=2, progress=False) == [9, 1, 4]


@given(
    st.lists(st.sampled_from(["chain", "fanout", "mixed", "metagpt-sop"]), min_size=1, unique=True),
    st.lists(st.integers(1, 5), min_size=1, max_size=3, unique=True),
    st.none() | st.just(("lpm", "topas:aging=0")),
    st.floats(0.5, 100),
)
def test_a_config_round_trips_through_json(families, counts, policies, limit):
    config = GapConfig(
        families=tuple(families), task_counts=tuple(counts), policies=policies, time_limit=limit
    )
    text = json.dumps(config.to_json())
    assert GapConfig.from_json(json.loads(text)) == config


def test_a_config_refuses_unknown_fields_and_bad_values():
    with pytest.raises(InputError, match="unknown field.*colour"):
        GapConfig.from_json({"families": ["chain"], "colour": "red"})
    with pytest.raises(InputError, match="instances"):
        GapConfig.from_json({"families": ["chain"], "instances": 0})


def test_csv_cells_and_columns():
    assert [cell(None), cell(True), cell(math.inf), cell(1 / 3)] == ["", "true", "", "0.3333333333"]
    rows = [{"b": 1, "a": 2.5}, {"a": 1.0, "c": None}]
    assert rows_to_csv(rows, columns=("a", "z")) == "a,b,c\n2.5,1,\n1,,\n"
    assert md_table(["x", "y"], [[1, 2]]) == "| x | y |\n|---|---|\n| 1 | 2 |"


def test_outputs_refuse_a_file_in_place_of_the_folder(tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        write_outputs(tmp_path / "out", {"a.txt": "y"})
    write_outputs(tmp_path / "new", {"a.txt": "y", "b.png": b"\x89PNG"})
    assert (tmp_path / "new" / "a.txt").read_text() == "y"


def test_study_params_are_frozen_and_round_trip_through_json():
    from topas.studies import StudyParams

    cfg = StudyParams({"loads": [0.5, 1.0], "map_kv": {"0.2": 61440}, "policies": ("lpm",)})
    assert cfg["loads"] == (0.5, 1.0) and cfg["map_kv"]["0.2"] == 61440
    with pytest.raises(TypeError):
        cfg["loads"] = (2.0,)  # type: ignore[index]
    again = StudyParams.from_json(json.loads(json.dumps(cfg.to_json())))
    assert again == cfg and again.to_json() == cfg.to_json()


# --------------------------------------------------------------------------- checkpoint


def _fail_on_3(x: int) -> int:
    if x == 3:
        raise RuntimeError("stopped at job 3")
    return x * x


def _never(x: int) -> int:
    raise AssertionError(f"job {x} ran again")


def test_an_interrupted_run_resumes_without_running_finished_jobs_again(tmp_path):
    # n_jobs=1 runs the jobs in order: 5, 2 and 7 finish, then 3 fails (a kill would
    # leave the same file: every result is synced as it arrives)
    checkpoint = Checkpoint(tmp_path / CHECKPOINT_NAME)
    with pytest.raises(RuntimeError, match="job 3"):
        run_jobs(_fail_on_3, [5, 2, 7, 3, 4], n_jobs=1, progress=False, checkpoint=checkpoint)
    assert sorted(checkpoint.load().values()) == [4, 25, 49]
    # the resumed run runs 3 and 4 only: a finished job rerun would raise
    again = run_jobs(_square, [5, 2, 7, 3, 4], n_jobs=1, progress=False, checkpoint=checkpoint)
    assert again == [25, 4, 49, 9, 16] and checkpoint.resumed == 3
    assert run_jobs(_never, [5, 2, 7, 3, 4], 1, False, checkpoint=checkpoint) == again
    assert checkpoint.resumed == 5


def test_a_record_cut_short_is_dropped_and_later_records_still_read(tmp_path):
    checkpoint = Checkpoint(tmp_path / "c.pkl")
    for job in ({"seed": 1}, {"seed": 2}, {"seed": 3}):
        checkpoint.append(job_key(job), {"mean_jct": float(job["seed"])})
    data = checkpoint.path.read_bytes()
    checkpoint.path.write_bytes(data[:-5])  # killed while writing the third record
    assert list(checkpoint.load()) == [job_key({"seed": 1}), job_key({"seed": 2})]
    checkpoint.append(job_key({"seed": 3}), {"mean_jct": 3.0})
    assert checkpoint.load()[job_key({"seed": 3})] == {"mean_jct": 3.0}
    assert len(checkpoint.load()) == 3


def test_a_checkpoint_is_not_started_over_without_resume(tmp_path):
    assert not Checkpoint.open(tmp_path, resume=False).path.exists()  # nothing created
    Checkpoint.open(tmp_path, resume=False).append(job_key(1), 1)
    with pytest.raises(InputError, match=r"holds 1 finished run.*--resume"):
        Checkpoint.open(tmp_path, resume=False)
    path = tmp_path / CHECKPOINT_NAME
    torn = path.read_bytes() + b"\x80"  # a second record cut short
    path.write_bytes(torn)
    with pytest.raises(InputError, match="holds 1 finished run"):
        Checkpoint.open(tmp_path, resume=False)
    assert path.read_bytes() == torn  # the refusal leaves the file as it was
    assert Checkpoint.open(tmp_path, resume=True).load() == {job_key(1): 1}
    checkpoint = Checkpoint.open(tmp_path, resume=True)
    checkpoint.remove()
    assert not checkpoint.path.exists()
    checkpoint.remove()  # already gone: no error


def test_a_job_key_ignores_the_order_of_a_jobs_keys():
    assert job_key({"seed": 1, "load": 0.8}) == job_key({"load": 0.8, "seed": 1})
    assert job_key({"seed": 1, "load": 0.8}) != job_key({"seed": 1, "load": 0.80001})
    assert job_key(("chain", 2, ("topas",))) == job_key(["chain", 2, ["topas"]])


@given(
    st.lists(st.integers(-50, 50), max_size=12),
    st.dictionaries(st.integers(-50, 50), st.integers(), max_size=12),
)
def test_resumed_results_are_the_stored_ones_and_the_rest_are_run(jobs, stored):
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Checkpoint(Path(tmp) / CHECKPOINT_NAME)
        for job, result in stored.items():
            checkpoint.append(job_key(job), result)
        out = run_jobs(_square, jobs, n_jobs=1, progress=False, checkpoint=checkpoint)
        assert out == [stored[j] if j in stored else j * j for j in jobs]
        assert checkpoint.resumed == sum(j in stored for j in jobs)
        held = checkpoint.load()  # every job's result is now in the file
        assert all(held[job_key(j)] == r for j, r in zip(jobs, out, strict=True))
