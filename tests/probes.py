"""The checks every research probe under ``analysis/`` gets (``guarded_spf``, ``boost``):
its schedules keep every invariant under hypothesis in both timing modes, and its
decisions are the same in processes with different hash seeds.

``probe_checks`` builds the three tests for a probe's specs; a test module binds them to
``test_*`` names so that pytest collects them there."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from conftest import jcts_across_processes, random_instances
from hypothesis import given
from test_properties import check_schedule

from topas import workloads
from topas.policies import make_policy
from topas.simulator import simulate
from topas.verify import verify_step

ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"
sys.path.insert(0, str(ANALYSIS))  # the probes' module specs resolve from here


def probe_checks(steps: Sequence[str], calibrated: str, process: str) -> tuple[Callable, ...]:
    """Tests of the invariants of each of ``steps`` (step model, with ``verify_step``) and
    of ``calibrated`` (calibrated model) over random instances, and of ``process``'s JCTs
    being the same across processes."""

    @pytest.mark.parametrize("spec", steps)
    @given(inst=random_instances())
    def step_invariants(spec: str, inst) -> None:
        sched = simulate(inst, make_policy(spec), timing="step", debug=True)
        check_schedule(inst, sched)
        verify_step(sched)

    @given(inst=random_instances())
    def calibrated_invariants(inst) -> None:
        sched = simulate(inst, make_policy(calibrated), timing="calibrated", debug=True)
        check_schedule(inst, sched)

    def decisions_do_not_depend_on_the_process(tmp_path: Path, monkeypatch) -> None:
        monkeypatch.setenv("PYTHONPATH", str(ANALYSIS))
        inst = workloads.small_instance("fanout", seed=1)
        first, second = jcts_across_processes(tmp_path, inst, process)
        assert first == second

    return step_invariants, calibrated_invariants, decisions_do_not_depend_on_the_process
