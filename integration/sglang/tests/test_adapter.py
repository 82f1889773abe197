"""The adapter on SGLang's real ``Req`` objects (needs sglang==0.5.23; skipped without)."""

from __future__ import annotations

from array import array

import pytest

sglang = pytest.importorskip("sglang")

from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from topas.instance import Stage, Task  # noqa: E402
from topas.workflow_metadata import encode  # noqa: E402
from topas_sglang.adapter import observe, stage_ref  # noqa: E402

TASK = Task(
    "t0",
    0.0,
    (Stage("a", "x", 5, 2), Stage("b", "y", 6, 3, ("a",)), Stage("c", "x", 4, 1, ("a",))),
)


def _req(rid, custom_params=None, tokens=8):
    sp = SamplingParams(max_new_tokens=4, ignore_eos=True, custom_params=custom_params)
    sp.normalize(None)
    return Req(rid=rid, origin_input_text="", origin_input_ids=array("q", range(tokens)),
               sampling_params=sp)  # fmt: skip


def test_version_is_the_pinned_one():
    from topas_sglang import SGLANG_VERSION

    assert sglang.__version__ == SGLANG_VERSION


def test_tagged_untagged_and_malformed_requests():
    b = _req("t0/b", encode(TASK, "b", 16))
    c = _req("t0/c", encode(TASK, "c", 12))
    plain = _req("plain")
    broken = _req("broken", {"topas": "{not json"})
    releases: dict[str, float] = {}
    obs = observe([b, plain, broken], [c], releases)
    assert [(r.stage, r.running) for r in obs.requests] == [("b", False), ("c", True)]
    assert obs.reqs[("t0", "b")] is b and obs.reqs[("t0", "c")] is c
    assert obs.untagged == [plain, broken]
    assert len(obs.errors) == 1 and "broken" in obs.errors[0] and "not JSON" in obs.errors[0]
    assert obs.prefix_tokens == {"x": 12, "y": 16}
    assert set(releases) == {"t0"}
    # the request's own queue time, on SGLang's clock
    assert obs.requests[0].queued_at == pytest.approx(b.time_stats.scheduler_recv_time)
    # a request's stage as observe reads it; None for the untagged and the malformed
    assert [stage_ref(r) for r in (b, c, plain, broken)] == [("t0", "b"), ("t0", "c"), None, None]
