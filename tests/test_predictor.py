"""The injected timing: one Predictor per timing mode, and no policy that names a mode."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import make, stage, task

from topas.instance import HostLoad
from topas.policies.base import PolicyContext
from topas.simulator import ENGINES
from topas.timing import (
    PREDICTORS,
    REFERENCE_DECODE_BATCH,
    TIMING_MODES,
    iteration_s,
    linear_cost,
    predictor,
)

ROOT = Path(__file__).resolve().parents[1]


def _inst(**server):  # type: ignore[no-untyped-def]
    return make({"a": 40}, [task("t", 0, stage("x", "a", 25, 7))], capacity=200, **server)


def test_every_mode_has_a_predictor_and_an_engine():
    assert tuple(PREDICTORS) == tuple(ENGINES) == TIMING_MODES


def test_step_predictor_by_hand():
    # chunk 10, step_s 1: a stage of 25 input and 7 output tokens lasts ceil(25/10) + 7 =
    # 10 steps; a 40-token prompt loads in ceil(40/10) = 4 steps, beside the stages' own
    p = predictor(_inst().server, "step")
    assert p.service_s(25, 7) == 10.0 and p.load_s(40) == 4.0
    assert p.discrete and not p.loads_share_compute


def test_calibrated_predictor_by_hand():
    server = _inst().server  # a step cost model: the calibrated one uses DEFAULT_LINEAR
    p = predictor(server, "calibrated")
    cost = linear_cost(server)
    per_iter = iteration_s(cost, 0, REFERENCE_DECODE_BATCH, 0.0)
    assert p.service_s(25, 7) == pytest.approx(25 * cost.prefill_token_s + 7 * per_iter)
    assert p.load_s(40) == pytest.approx(40 * cost.prefill_token_s)  # a recompute prefill
    assert p.loads_share_compute and not p.discrete
    host = _inst(load={"kind": "host", "tokens_per_s": 80}).server
    assert isinstance(host.prefix_load, HostLoad)
    swap = PolicyContext(server=host, timing="calibrated").predict
    assert swap.load_s(40) == pytest.approx(0.5) and not swap.loads_share_compute
    # an engine with a host tier (SGLang's HiCache) tells whether the prompt has a copy
    # there: with one it is a swap, without one a recompute; the step model has no tiers
    assert swap.load_s(40, host_copy=True) == pytest.approx(0.5)
    assert swap.load_s(40, host_copy=False) == pytest.approx(40 * cost.prefill_token_s)
    step = predictor(host, "step")
    assert step.load_s(40, host_copy=False) == step.load_s(40, host_copy=True) == step.load_s(40)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown timing mode 'fast'"):
        predictor(_inst().server, "fast")


def test_no_policy_branches_on_the_name_of_a_timing_mode():
    # policies read durations through PolicyContext.predict; a comparison with a mode's
    # name would bring back the branches the Predictor replaced
    sources = [*(ROOT / "topas" / "policies").glob("*.py")]  # TOPAS's modules among them
    sources += [*(ROOT / "integration" / "sglang" / "topas_sglang").glob("*.py")]
    assert len(sources) > 8
    pattern = re.compile(r"""timing\s*[!=]=|[!=]=\s*["'](step|calibrated)["']""")
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in sources
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, offenders


def test_no_policy_reads_the_engines_own_kv_need():
    # rule 11: State.need is the engine's answer and, in the step model, reads the true
    # output length; a policy's own KV arithmetic uses State.estimated_need
    sources = [*(ROOT / "topas" / "policies").glob("*.py")]
    assert {p.name for p in sources} >= {"search.py", "search_view.py", "greedy.py"}
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in sources
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\.need\(", line)
    ]
    assert not offenders, offenders
