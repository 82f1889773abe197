"""Tensor parallelism: two scheduler ranks, each in its own process with SGLang's real
scheduling objects (the CPU loop), joined by a real gloo process group and SGLang's own
``broadcast_pyobj``, take the same decisions although their clocks and queue stamps
differ; SGLang's own rank-consensus checker watches their tree calls (skipped without
SGLang)."""

from __future__ import annotations

import json
import multiprocessing
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("sglang")

from topas_sglang.ranks import RankMismatch, Word, apply_order, check_retraction  # noqa: E402

WORLD = 2


def _rank_main(rank: int, linked: bool, workdir: str) -> None:
    """One scheduler rank: replay the instance through the hooked SGLang objects and write
    what it decided at every hooked call (queue order, hold-backs, eviction ranks) and what
    ran, to ``workdir/rank{rank}.json``."""
    import os
    from types import SimpleNamespace

    log = os.open(f"{workdir}/rank{rank}.log", os.O_WRONLY | os.O_CREAT)
    os.dup2(log, 2)  # this rank's log (SGLang's checker reports a divergence there)

    import torch.distributed as dist
    from sglang.srt.distributed.parallel_state import GroupCoordinator
    from sglang.srt.managers import schedule_policy
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.utils import rank_consensus_checker as consensus

    from topas.workloads import generate
    from topas_sglang import hooks
    from topas_sglang.cpu_loop import EPOCH, CpuLoop, load_plugin
    from topas_sglang.retention import controller_of

    load_plugin()
    # as in test_cpu_loop: SGLang reserves at most 8 output tokens, so decode retracts
    schedule_policy.CLIP_MAX_NEW_TOKENS = 8
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous",
                            rank=rank, world_size=WORLD)  # fmt: skip
    # SGLang's own rank-consensus checker compares every checked tree call (match, insert,
    # evict: unified_radix_cache.py) across the ranks and exits with status 1 if they part
    consensus.configure([SimpleNamespace(cpu_group=dist.group.WORLD)])
    inst = generate("chain", num_tasks=8, seed=1, load=2.0)
    offset = 1000.0 * rank  # each rank stamps with its own clock, as perf_counter does

    class RankLoop(CpuLoop):
        def _send(self, ref):  # type: ignore[no-untyped-def]
            super()._send(ref)  # stamped on this rank's clock, with its own jitter
            jitter = 0.05 * (zlib.crc32("/".join(ref).encode()) % 7) if rank else 0.0
            self.waiting[-1].time_stats.wait_queue_entry_time += offset + jitter

        def _run(self) -> None:
            hooks.clock = lambda: EPOCH + offset + self.t
            super()._run()

    loop = RankLoop(inst, "topas", kv_tokens=12_000)
    controller = controller_of(loop.cache)
    controller.budget_ms = 0.05  # the wall clock decides which rounds rank 0 plans
    controller.policy_spec = "topas"  # the search: it holds stages back
    if linked:  # SGLang's own TP group over the two processes, published as a server
        # publishes it; the controller finds it there (ranks.sglang_link) at first use
        tp = GroupCoordinator(group_ranks=[list(range(WORLD))], local_rank=rank,
                              torch_distributed_backend="gloo", use_pynccl=False,
                              use_mscclpp=False, use_custom_allreduce=False,
                              use_torch_symm_mem_all_reduce=False, use_hpu_communicator=False,
                              use_xpu_communicator=False, group_name="tp")  # fmt: skip
        get_parallel().override_permanently(tp_size=WORLD, attn_tp_size=WORLD, moe_tp_size=WORLD,
                                            tp_group=tp)  # fmt: skip
    calls = []
    original = loop.policy.calc_priority

    def recorded(waiting, batch, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = original(waiting, batch, *args, **kwargs)
        calls.append([[r.rid for r in waiting], sorted(controller.held_rids),
                      sorted([k, list(v)] for k, v in controller.ranks.items())])  # fmt: skip
        return out

    loop.policy.calc_priority = recorded
    result = loop.run()
    consensus.shutdown()  # checks the last calls
    stats = result.stats
    link = controller.link
    Path(workdir, f"rank{rank}.json").write_text(json.dumps({
        "calls": calls, "finished": result.finished, "retractions": result.retractions,
        "followed": stats.followed, "rounds": stats.rounds,
        "retraction_orders": stats.retraction_orders, "fallbacks": stats.fallbacks,
        "held": stats.held, "over_budget": stats.over_budget, "reordered": stats.reordered,
        "link": None if link is None else [link.rank, link.size],
    }))  # fmt: skip
    dist.destroy_process_group()


def _run_ranks(workdir: Path, linked: bool, monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """Start both ranks (fresh processes, as SGLang starts its schedulers) with SGLang's
    rank-consensus checker on; their exit codes."""
    monkeypatch.setenv("SGLANG_ENABLE_RANK_CONSENSUS_CHECKER", "1")  # read at import
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, linked, str(workdir))) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    for p in procs:
        if p.is_alive():  # pragma: no cover - a hang is a failure, not a stuck suite
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


def _outputs(workdir: Path) -> list[dict]:
    return [json.loads((workdir / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_tp_ranks_decide_alike_with_rank_zeros_plan(tmp_path, monkeypatch):
    assert _run_ranks(tmp_path, linked=True, monkeypatch=monkeypatch) == [0] * WORLD
    lead, follow = _outputs(tmp_path)
    assert [lead["link"], follow["link"]] == [[0, 2], [1, 2]]  # found in SGLang's state
    assert lead["calls"] == follow["calls"]  # every round: order, hold-backs, ranks
    assert lead["finished"] == follow["finished"] and lead["retractions"] == follow["retractions"]
    # rank 1 never planned: every call and retraction order was rank 0's
    assert follow["rounds"] == 0
    assert follow["followed"] == len(follow["calls"]) + lead["retraction_orders"]
    assert lead["rounds"] > 0 and lead["reordered"] > 0 and lead["retraction_orders"] > 0
    assert lead["fallbacks"] == follow["fallbacks"] == 0
    assert any(ranks for _, _, ranks in lead["calls"])  # prompts were ranked, and agreed
    assert any(held for _, held, _ in lead["calls"])  # stages were held back, and agreed
    for r in range(WORLD):
        log = (tmp_path / f"rank{r}.log").read_text()
        assert "Rank consensus checker is enabled" in log and "Found rank divergence" not in log


def test_without_the_link_sglangs_checker_finds_the_ranks_parting(tmp_path, monkeypatch):
    # the control: the same two ranks planning on their own clocks take other decisions;
    # SGLang's checker sees their tree calls differ and stops both, as it would a server
    assert _run_ranks(tmp_path, linked=False, monkeypatch=monkeypatch) == [1] * WORLD
    for r in range(WORLD):
        assert "Found rank divergence" in (tmp_path / f"rank{r}.log").read_text()
        assert not (tmp_path / f"rank{r}.json").exists()  # stopped before the end


class _R:
    def __init__(self, rid: str) -> None:
        self.rid = rid


def test_a_follower_applies_rank_zeros_order_by_request_id():
    a, b, c = _R("a"), _R("b"), _R("c")
    w = Word(order=("c", "a", "b"), held=frozenset({"b"}), ranks=())
    assert apply_order([a, b, c], w) == [c, a, b]
    assert apply_order([a, b, c], Word(None, frozenset(), ())) is None  # SGLang's order
    with pytest.raises(RankMismatch, match="request c, not queued here"):
        apply_order([a, b, _R("d")], w)
    with pytest.raises(RankMismatch, match="ordered 3 requests, this rank has 2"):
        apply_order([a, b], w)
    with pytest.raises(RankMismatch, match="a request twice"):
        apply_order([a, b, c], Word(("c", "a", "a"), frozenset(), ()))
    assert check_retraction([2, 0, 1], 3) == [2, 0, 1]
    with pytest.raises(RankMismatch, match="batch of 4"):
        check_retraction([2, 0, 1], 4)


@given(st.data(), st.lists(st.text(min_size=1, max_size=6), unique=True, max_size=30))
def test_a_followers_queue_is_rank_zeros_order_or_a_mismatch(data, rids):
    # any permutation of the queue's rids is applied exactly; any word that names a rid
    # the queue lacks, names one twice or leaves one out is refused, never half applied
    queue = [_R(rid) for rid in rids]
    order = data.draw(st.permutations(rids))
    assert [r.rid for r in apply_order(queue, Word(tuple(order), frozenset(), ()))] == order
    if not rids:
        return
    i = data.draw(st.integers(0, len(rids) - 1))
    broken = data.draw(st.sampled_from(["stranger", "twice", "short"]))
    bad = list(order)
    if broken == "stranger":
        bad[i] = "\x00" + bad[i]  # no queued rid starts with NUL
    elif broken == "twice":
        if len(bad) < 2:  # one rid only: nothing to repeat
            return
        bad[(i + 1) % len(bad)] = bad[i]
    else:
        bad.pop(i)
    with pytest.raises(RankMismatch):
        apply_order(queue, Word(tuple(bad), frozenset(), ()))
