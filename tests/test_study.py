"""The study framework (topas/studies/__init__.py)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topas.errors import InputError
from topas.studies import cell, md_table, rows_to_csv, run_jobs, write_outputs
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
