"""Scheduler in the loop: workloads through SGLang's real SchedulePolicy, PrefillAdder
and radix cache, a timing model in place of the GPU (skipped without SGLang)."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")

from topas.timing import linear_cost  # noqa: E402
from topas.workloads import generate  # noqa: E402
from topas_sglang.cpu_loop import replay  # noqa: E402


def _check_replay(inst, result) -> None:  # type: ignore[no-untyped-def]
    """Every task completes, stages finish after their dependencies, each once, and no
    task beats its critical path at one token per iteration of the model's base time."""
    assert set(result.jct) == {t.id for t in inst.tasks}
    assert len(result.finished) == len(set(result.finished)) == inst.num_stages
    when = {ref: i for i, ref in enumerate(result.finished)}
    base = linear_cost(inst.server).base_s
    for task in inst.tasks:
        longest: dict[str, float] = {}
        for sid in task.topo_order:
            s = task.stage_by_id[sid]
            for d in s.deps:
                assert when[(task.id, d)] < when[(task.id, sid)]
            longest[sid] = s.output_tokens * base + max((longest[d] for d in s.deps), default=0)
        assert result.jct[task.id] >= max(longest.values()) - 1e-9


@pytest.mark.parametrize("workload", ["metagpt-sop", "fanout"])
def test_the_plugin_takes_effect_in_sglangs_scheduler(workload):
    inst = generate(workload, num_tasks=12, seed=3, load=1.2)
    plain = replay(inst, "lru")  # SGLang as it ships: lpm order, LRU eviction
    topas = replay(inst, "topas")
    for result in (plain, topas):
        _check_replay(inst, result)
    assert plain.stats is None
    stats = topas.stats
    assert stats.rounds > 0 and stats.fallbacks == 0 and stats.malformed == 0
    assert stats.finished == inst.num_stages and stats.reappeared == 0  # SGLang's signals
    assert stats.reordered > 0  # TOPAS's order was used ...
    assert topas.finished != plain.finished  # ... and changed what ran when


def test_memory_pressure_retracts_through_the_hooked_order(monkeypatch):
    # With ignore_eos SGLang reserves every output token it will decode, so it never
    # runs out; reserving at most 8 (as SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=8 makes
    # a server do) over-admits, and decode must retract, through the plugin's order.
    from sglang.srt.managers import schedule_policy

    monkeypatch.setattr(schedule_policy, "CLIP_MAX_NEW_TOKENS", 8)
    inst = generate("chain", num_tasks=6, seed=1, load=2.0)
    result = replay(inst, "topas", kv_tokens=12_000)
    _check_replay(inst, result)
    assert result.retractions > 0 and result.stats.retraction_orders > 0
    assert result.stats.finished == inst.num_stages  # a retraction is no finish signal
