"""The TOPAS plugin inside real SGLang 0.5.23 classes on the CPU (skipped without SGLang)."""

from __future__ import annotations

import logging
import os
import time
from array import array

import pytest
from conftest import cache_prompt, cached_len, make_cache, make_req, schedule_policy

from topas.instance import ServerSpec, Stage, Task
from topas.observe import observed_state
from topas.policies.base import PolicyContext
from topas.policies.greedy import TOPASGreedy
from topas.state import Decision
from topas.workflow_metadata import encode

sglang = pytest.importorskip("sglang")

from sglang.srt.managers.schedule_batch import ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import AddReqResult, SchedulePolicy  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402

from topas_sglang import controller as controller_mod  # noqa: E402
from topas_sglang.adapter import observe  # noqa: E402
from topas_sglang.controller import Controller, queue_order  # noqa: E402
from topas_sglang.hooks import TopasPrefillAdder  # noqa: E402
from topas_sglang.offload import Offloaded  # noqa: E402
from topas_sglang.plugin import VersionError, check_version  # noqa: E402
from topas_sglang.retention import TopasRetention, controller_of  # noqa: E402

PROMPTS = {  # each agent's system prompt: fixed, disjoint token ids
    "pm": list(range(1000, 1064)),
    "eng": list(range(2000, 2048)),
    "qa": list(range(3000, 3032)),
}


def stage_req(task: Task, sid: str, fresh: int = 0, max_new: int | None = None):  # type: ignore[no-untyped-def]
    """The request of one stage, as `topas serve-bench` sends it."""
    s = task.stage_by_id[sid]
    prompt = PROMPTS[s.agent]
    base = 10_000 + 100 * (hash((task.id, sid)) % 50) + fresh
    tokens = prompt + list(range(base, base + s.input_tokens))
    meta = encode(task, sid, len(prompt), prefixes={a: len(p) for a, p in PROMPTS.items()})
    return make_req(f"{task.id}/{sid}", tokens, meta, max_new or s.output_tokens)


class Reference:
    """TOPAS itself on the state the requests and the cache describe, one policy across
    rounds as the controller keeps it: what the hooks must reproduce."""

    def __init__(self, cache) -> None:  # type: ignore[no-untyped-def]
        self.cache = cache
        self.server = ServerSpec(
            kv_capacity_tokens=cache.token_to_kv_pool_allocator.size,
            chunk_tokens=controller_mod.DEFAULT_CHUNK,
            max_running=cache.req_to_token_pool.size,
        )
        self.policy = TOPASGreedy()
        self.policy.reset(PolicyContext(server=self.server, timing="calibrated"))
        self.releases: dict[str, float] = {}

    def state(self, waiting, running, finished=None):  # type: ignore[no-untyped-def]
        obs = observe(waiting, running, self.releases)
        tasks = {r.task.id: r.task for r in obs.requests}
        resident = [a for a, p in PROMPTS.items() if cached_len(self.cache, p) == len(p)]
        cap = self.server.kv_capacity_tokens

        def kv_need(ref, generated):  # type: ignore[no-untyped-def]
            # SGLang reserves input + remaining predicted output, at least one more token
            s = tasks[ref[0]].stage_by_id[ref[1]]
            return min(s.input_tokens + max(s.predicted_output, generated + 1),
                       cap - len(PROMPTS[s.agent]))  # fmt: skip

        prefix = {a: len(p) for a, p in PROMPTS.items()}
        now = time.perf_counter()
        return observed_state(self.server, prefix, obs.requests, resident, now, kv_need, finished)

    def decide(self, waiting, running=(), finished=None):  # type: ignore[no-untyped-def]
        return self.policy.decide(self.state(waiting, running, finished))

    def retraction_order(self, running):  # type: ignore[no-untyped-def]
        state = self.state([], running)
        return self.policy.retraction_order(state, list(state.running))


# ---------------------------------------------------------------------- plugin loading


def test_entry_point_is_discovered_and_hooks_applied(plugin):
    from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES
    from sglang.srt.mem_cache.utils import _EVICTION_POLICY_FACTORIES

    assert "topas" in RADIX_EVICTION_POLICY_CHOICES
    assert _EVICTION_POLICY_FACTORIES["topas"] is TopasRetention
    assert SchedulePolicy.calc_priority.__wrapped__.__name__ == "calc_priority"
    assert Scheduler.get_prefill_adder_class(None) is TopasPrefillAdder
    raw = ScheduleBatch.__dict__["_get_decode_retraction_order"]
    assert isinstance(raw, staticmethod) and hasattr(raw.__func__, "__wrapped__")


def test_other_sglang_versions_are_refused(monkeypatch, caplog):
    check_version(sglang.__version__)
    with pytest.raises(VersionError, match=r"supports SGLang 0\.5\.23 only, found 0\.5\.24"):
        check_version("0.5.24")
    from topas_sglang import plugin

    monkeypatch.setattr(sglang, "__version__", "0.5.24")
    with caplog.at_level(logging.ERROR, logger="topas_sglang"):
        assert plugin.register() is False
    assert "install sglang==0.5.23" in caplog.text


def test_the_documented_flags_parse_and_configure_the_plugin():
    from sglang.srt.mem_cache.utils import get_eviction_strategy
    from sglang.srt.server_args import prepare_server_args

    from topas.policies import PolicySpecError

    args = prepare_server_args(["--model-path", "dummy", "--schedule-policy", "lpm",
                                "--radix-eviction-policy", "topas",
                                "--radix-eviction-policy-config",
                                '{"policy": "topas-greedy:horizon=2"}'])  # fmt: skip
    strategy = get_eviction_strategy(args.radix_eviction_policy, args.radix_eviction_policy_config)
    assert isinstance(strategy, TopasRetention)
    assert strategy.controller.policy_spec == "topas-greedy:horizon=2"
    # planning in a planner process by default (started at the first round, not here);
    # "offload": false plans in the scheduler's thread
    assert isinstance(strategy.controller, Offloaded) and strategy.controller.lookahead
    assert type(get_eviction_strategy("topas", {"offload": False}).controller) is Controller
    with pytest.raises(PolicySpecError, match="horizn"):  # a typo stops the server at start
        get_eviction_strategy("topas", {"policy": "topas-greedy:horizn=2"})


def test_sglangs_launcher_accepts_the_flag_through_the_installed_entry_point():
    # The real `python -m sglang.launch_server` in a fresh process: the entry point is
    # found and `--radix-eviction-policy topas` parses; on this CPU-only host the server
    # then stops at device detection. With the plugin excluded argparse rejects the name.
    import subprocess
    import sys
    from pathlib import Path

    import torch

    if torch.cuda.is_available():
        pytest.skip("would start a real server on this GPU")
    model = Path(__file__).resolve().parents[1] / "models" / "llama-3-8b"
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
           "--load-format", "dummy", "--skip-tokenizer-init",
           "--radix-eviction-policy", "topas"]  # fmt: skip
    runs = {}
    for allow in ("topas", "none-of-them"):
        env = {**os.environ, "SGLANG_PLUGINS": allow}
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        runs[allow] = run.stdout + run.stderr
    assert "invalid choice" not in runs["topas"] and "No accelerator" in runs["topas"]
    assert "invalid choice: 'topas'" in runs["none-of-them"]


def test_topas_eviction_selects_the_python_tree_core():
    topas = make_cache("topas")
    plain = make_cache("lru")
    assert type(topas.tree_core).__name__ == "UnifiedTreeCore"  # Python core
    assert controller_of(topas) is not None
    assert type(plain.tree_core).__name__ != "UnifiedTreeCore"  # SGLang's default: Rust
    assert controller_of(plain) is None


# ---------------------------------------------------------------------- ordering


def _queue(policy, reqs, running=None):  # type: ignore[no-untyped-def]
    queue = list(reqs)
    policy.calc_priority(queue, running)
    return queue


def _rids(reqs) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.rid for r in reqs]


def test_calc_priority_orders_the_queue_as_topas_decides():
    # t0's one stage (agent eng, whose prompt is cached) decodes 300 tokens; t1 is two
    # 2-token stages with uncached prompts. SGLang's lpm puts the longest cached prefix,
    # t0, first; TOPAS starts the short task first (its path ends soonest: Smith's rule).
    t0 = Task("t0", 0.0, (Stage("s", "eng", 8, 300),))
    t1 = Task("t1", 0.0, (Stage("a", "pm", 8, 2), Stage("b", "qa", 8, 2, ("a",))))
    t2 = Task("t2", 0.0, (Stage("c", "qa", 30, 40),))
    orders = {}
    for eviction in ("lru", "topas"):
        cache = make_cache(eviction)
        cache_prompt(cache, PROMPTS["eng"])
        reqs = [stage_req(t2, "c"), stage_req(t1, "a"), stage_req(t0, "s")]
        if eviction == "topas":
            decision = Reference(cache).decide(reqs)
        orders[eviction] = _rids(_queue(schedule_policy(cache), reqs))
    assert orders["lru"][0] == "t0/s"  # SGLang's lpm: the cached prefix first
    admitted = ["/".join(ref) for ref in decision.admit]
    assert admitted[0] == "t1/a"
    assert orders["topas"] == admitted + [r for r in orders["lru"] if r not in admitted]


def test_untagged_and_bad_metadata_keep_their_sglang_positions():
    t0 = Task("t0", 0.0, (Stage("s", "eng", 8, 300),))
    t1 = Task("t1", 0.0, (Stage("a", "pm", 8, 2),))
    good = encode(t1, "a", 64)
    bad = {
        "plain": None,
        "not-json": {"topas": "{oops"},
        "wrong-version": {"topas": good["topas"].replace('"v":1', '"v":9')},
        "unknown-stage": {"topas": good["topas"].replace('"stage":"a"', '"stage":"zz"')},
    }
    orders = {}
    for eviction in ("lru", "topas"):
        cache = make_cache(eviction)
        cache_prompt(cache, PROMPTS["eng"])
        others = [make_req(rid, PROMPTS["qa"] + [7, 8, 9], params) for rid, params in bad.items()]
        reqs = [others[0], stage_req(t1, "a"), others[1], others[2], stage_req(t0, "s"), others[3]]
        policy = schedule_policy(cache)
        orders[eviction] = _rids(_queue(policy, reqs))
        if eviction == "topas":
            stats = controller_of(cache).stats
    tagged = {"t0/s", "t1/a"}
    for i, rid in enumerate(orders["lru"]):  # every untagged request stays where SGLang put it
        assert (orders["topas"][i] in tagged) == (rid in tagged)
        if rid not in tagged:
            assert orders["topas"][i] == rid
    assert orders["topas"] != orders["lru"]  # and the tagged ones were reordered
    assert stats.malformed == 3  # the plain request has no metadata: not an error


@pytest.fixture
def hold_back_case():
    """pm's 2000-token prompt and eng's are cached; t0's stage r (agent eng) runs and its
    eight children need pm. t1's stage w (50 + 10 tokens) fits only if pm's prompt goes
    (10 tokens short). TOPAS holds w back to keep the prompt t0 is about to reuse
    eight times (test_greedy prices the same trade by hand); SGLang alone admits w
    and evicts the prompt. t2's one pm stage lets the scheduler see pm's prompt."""
    PROMPTS["pm"] = list(range(5000, 7000))
    t0 = Task("t0", 0.0, (Stage("r", "eng", 8, 4),
                          *(Stage(f"x{i}", "pm", 8, 1, ("r",)) for i in range(8))))  # fmt: skip
    t1 = Task("t1", 0.0, (Stage("w", "qa", 50, 10),))
    t2 = Task("t2", 0.0, (Stage("p", "pm", 8, 4),))
    yield (t0, t1, t2), 2000 + 48 + 12 + 60 - 10
    PROMPTS["pm"] = list(range(1000, 1064))


def _adder(cache):  # type: ignore[no-untyped-def]
    """The scheduler's adder class (the plugin's), built as the scheduler builds it."""
    return Scheduler.get_prefill_adder_class(None)(
        1, cache, cache.token_to_kv_pool_allocator, ScheduleBatch(reqs=[]), 0.5, 4096, None
    )


def test_hold_back_keeps_the_request_queued_and_out_of_admission(hold_back_case):
    (t0, t1, t2), kv = hold_back_case
    results = {}
    for eviction in ("lru", "topas"):
        cache = make_cache(eviction, kv=kv)
        cache_prompt(cache, PROMPTS["pm"])
        cache_prompt(cache, PROMPTS["eng"])
        policy, ref = schedule_policy(cache), Reference(cache)
        teach = stage_req(t2, "p")
        _queue(policy, [teach])
        ref.decide([teach])
        run, w = stage_req(t0, "r"), stage_req(t1, "w")  # t2/p has gone: finished
        queue = _queue(policy, [w], ScheduleBatch(reqs=[run]))
        decision = ref.decide([w], [run], {"t2": ["p"]})
        w.init_next_round_input(cache)
        results[eviction] = (queue, _adder(cache).add_one_req(w, False, None), decision)
    queue, added, decision = results["topas"]
    assert decision.held == (("t1", "w"),) and not decision.admit
    assert len(queue) == 1 and added == AddReqResult.OTHER  # not admitted, still queued
    assert results["lru"][1] == AddReqResult.CONTINUE  # SGLang alone admits it


def test_hold_back_never_idles_the_server():
    # a decision that admits nothing and holds w: with nothing running, w is not held
    t1 = Task("t1", 0.0, (Stage("w", "qa", 50, 10),))
    w, plain = stage_req(t1, "w"), make_req("plain", [1, 2, 3])
    obs = observe([w, plain], [], {})
    hold = Decision(held=(("t1", "w"),))
    assert queue_order([w, plain], obs, hold, idle=False) == ([plain, w], [w])
    assert queue_order([w, plain], obs, hold, idle=True) == ([w, plain], [])


@pytest.fixture
def drain_case():
    """A's 1,000-token prompt is cached and its stage a0/s (8 in, 4 out) runs; E's
    100-token prompt is cached and idle, e0/s (8 in, 4 out) waits; C's 1,500-token prompt
    is absent and four C stages (8 in, 300 out) wait. KV 2,112 tokens: 1,000 are free, so
    C's prompt comes in only once A drains (a0 ends within its 4 tokens)."""
    PROMPTS.update(A=list(range(20_000, 21_000)), E=list(range(30_000, 30_100)),
                   C=list(range(40_000, 41_500)))  # fmt: skip
    a0 = Task("a0", 0.0, (Stage("s", "A", 8, 4),))
    e0 = Task("e0", 0.0, (Stage("s", "E", 8, 4),))
    cs = [Task(f"c{i}", 0.0, (Stage("s", "C", 8, 300),)) for i in range(4)]
    yield a0, e0, cs, 2112
    for agent in ("A", "E", "C"):
        del PROMPTS[agent]


@pytest.mark.parametrize("spec", ["topas", "topas:drain_load=0"])
def test_a_load_waiting_for_a_drain_keeps_its_memory_in_sglang(drain_case, spec):
    # TOPAS (the search) drops A, whose stage ends soon, keeps E and lets C's prompt wait
    # for the memory A returns (drain_load, the default): nothing may start now, so e0,
    # which would fit in the 1,000 tokens free, is held, and C's stages go first, which
    # SGLang's own adder cannot fit yet (it stops there, as when memory runs out). Once A
    # has drained they fit, and their prefill loads C's prompt. Without drain_load, C
    # cannot come in: TOPAS keeps A and E, holds C's stages and e0 starts.
    a0, e0, cs, kv = drain_case
    cache = make_cache("topas", kv=kv)
    controller = controller_of(cache)
    controller.policy_spec = spec
    cache_prompt(cache, PROMPTS["A"])
    cache_prompt(cache, PROMPTS["E"])
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", PROMPTS["A"]))))
    cache.inc_lock_ref(match.last_device_node)  # a0 runs on A's prompt: not evictable
    policy = schedule_policy(cache)
    teach = [stage_req(Task(f"k{a}", 0.0, (Stage("s", a, 4, 1),)), "s") for a in ("A", "E")]
    _queue(policy, teach)  # the scheduler sees both cached prompts
    run = stage_req(a0, "s")
    waiting = [stage_req(e0, "s"), *(stage_req(t, "s") for t in cs)]
    queue = _queue(policy, waiting, ScheduleBatch(reqs=[run]))
    c_rids = [f"c{i}/s" for i in range(4)]
    for req in queue:
        req.init_next_round_input(cache)
    if spec == "topas":
        assert _rids(queue) == [*c_rids, "e0/s"] and controller.held_rids == {"e0/s"}
        assert _adder(cache).add_one_req(queue[0], False, None) == AddReqResult.NO_TOKEN
    else:
        assert _rids(queue) == ["e0/s", *c_rids] and controller.held_rids == set(c_rids)
        assert _adder(cache).add_one_req(queue[0], False, None) == AddReqResult.CONTINUE
    assert _adder(cache).add_one_req(queue[-1], False, None) == AddReqResult.OTHER


# ---------------------------------------------------------------------- retention


def test_retained_prompt_survives_an_eviction_lru_would_make():
    # pm's and eng's prompts are cached, eng's used last. t3 waits on agent qa and then
    # needs pm: TOPAS keeps pm (near reuse) and lets eng go. Plain LRU evicts pm.
    t3 = Task("t3", 0.0, (Stage("x", "qa", 8, 4), Stage("y", "pm", 8, 4, ("x",))))
    teach = [stage_req(Task(f"k{a}", 0.0, (Stage("s", a, 4, 1),)), "s") for a in ("pm", "eng")]
    survivors = {}
    for eviction in ("lru", "topas"):
        cache = make_cache(eviction)
        policy = schedule_policy(cache)
        cache_prompt(cache, PROMPTS["pm"])
        cache_prompt(cache, PROMPTS["eng"])
        _queue(policy, teach)  # the scheduler sees both agents' prompts
        cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", PROMPTS["eng"]))))
        _queue(policy, [stage_req(t3, "x")])  # eng was touched last; t3 will need pm
        cache.evict(EvictParams(num_tokens=len(PROMPTS["eng"])))
        survivors[eviction] = [a for a in ("pm", "eng") if cached_len(cache, PROMPTS[a])]
    assert survivors == {"lru": ["eng"], "topas": ["pm"]}


# ---------------------------------------------------------------------- safety


@pytest.mark.parametrize("where", ["observe", "Observer.state"])
def test_a_failure_inside_the_plugin_keeps_sglangs_order(monkeypatch, caplog, where):
    t0 = Task("t0", 0.0, (Stage("s", "eng", 8, 300),))
    t1 = Task("t1", 0.0, (Stage("a", "pm", 8, 2),))
    reqs = [stage_req(t1, "a"), make_req("plain", [5, 6]), stage_req(t0, "s")]
    plain = make_cache("lru")
    cache_prompt(plain, PROMPTS["eng"])
    want = _rids(_queue(schedule_policy(plain), reqs))

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError(f"injected fault in {where}")

    owner, _, name = where.rpartition(".")  # the adapter, or the state builder's method
    monkeypatch.setattr(getattr(controller_mod, owner) if owner else controller_mod, name, broken)
    cache = make_cache("topas")
    cache_prompt(cache, PROMPTS["eng"])
    policy = schedule_policy(cache)
    with caplog.at_level(logging.WARNING, logger="topas_sglang"):
        for i in range(3):
            reqs.append(make_req(f"new{i}", [9, i]))  # a changed queue: planned afresh
            queue = _queue(policy, reqs)
            want.append(f"new{i}")
            assert _rids(queue) == want  # SGLang's own order, every request once
    controller = controller_of(cache)
    assert controller.stats.fallbacks == 3 and controller.held_rids == frozenset()
    assert sum("injected fault" in r.getMessage() for r in caplog.records) <= 1  # logged once


# ---------------------------------------------------------------------- hot path


def test_the_adapter_reuses_what_a_request_has_not_changed():
    # Round after round a waiting request's metadata and Request are the same: the memo
    # returns the very objects; a request that decoded a token gets a new Request, and
    # the memo keeps only the requests of the last round.
    t0 = Task("t0", 0.0, (Stage("a", "pm", 8, 5),))
    t1 = Task("t1", 0.0, (Stage("b", "eng", 8, 5),))
    a, b, plain = stage_req(t0, "a"), stage_req(t1, "b"), make_req("plain", [1, 2])
    memo, releases = {}, {}
    first = observe([a, plain], [b], releases, memo)
    again = observe([a, plain], [b], releases, memo)
    assert again.requests == first.requests == observe([a, plain], [b], dict(releases)).requests
    assert all(x is y for x, y in zip(again.requests, first.requests, strict=True))
    b.output_ids.append(7)
    third = observe([a], [b], releases, memo)
    assert third.requests[0] is first.requests[0] and third.requests[1].generated == 1
    assert set(memo) == {id(a), id(b)} and third.untagged == []


def test_a_spent_time_budget_keeps_sglangs_order():
    # budget_ms bounds the plugin's mean planning time per round: with a budget far
    # below one plan's cost, the rounds after the first keep SGLang's order (counted in
    # over_budget) until the budget is earned back; with budget_ms 0 every round plans.
    from sglang.srt.mem_cache.utils import get_eviction_strategy

    t0 = Task("t0", 0.0, (Stage("s", "eng", 8, 300),))
    t1 = Task("t1", 0.0, (Stage("a", "pm", 8, 2), Stage("b", "qa", 8, 2, ("a",))))
    plain = make_cache("lru")
    cache_prompt(plain, PROMPTS["eng"])
    reqs = [stage_req(t1, "a"), stage_req(t0, "s")]
    sglang_order = _rids(_queue(schedule_policy(plain), reqs))
    orders = {}
    for budget in (1e-6, 0):
        cache = make_cache("topas")
        controller_of(cache).budget_ms = budget
        cache_prompt(cache, PROMPTS["eng"])
        policy = schedule_policy(cache)
        orders[budget] = [_rids(_queue(policy, [*reqs, make_req(f"x{i}", [9, i])]))[:2]
                          for i in range(4)]  # fmt: skip
        stats = controller_of(cache).stats
        assert stats.rounds + stats.over_budget == 4
        if budget:
            assert stats.rounds == 1 and stats.over_budget == 3
        else:
            assert stats.rounds == 4 and stats.over_budget == 0
    assert orders[0][0] != sglang_order  # TOPAS's order ...
    assert orders[1e-6][0] == orders[0][0]  # ... in the planned round
    assert orders[1e-6][1:] == [sglang_order] * 3  # SGLang's once the budget is spent
    with pytest.raises(ValueError, match="budget_ms: a number of ms per round >= 0"):
        get_eviction_strategy("topas", {"budget_ms": -1})


# ---------------------------------------------------------------------- HiCache


def test_a_prompt_in_host_memory_is_a_swap_away_not_absent():
    # With HiCache a prompt evicted from the device keeps its host copy (the node is
    # `evicted` and `backuped`). SGLang's host pool needs CUDA (pool_host/common.py,
    # _cuda_host_register), so this host copy is made by hand on a real tree: pm's prompt
    # nodes lose their device value and keep a host value. TOPAS then sees pm on the host
    # (a swap at the default profile's host rate), eng on the device, qa nowhere (a
    # recompute), and without a host tier no prompt has a host copy.
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    from topas.instance import HostLoad
    from topas.state import PrefixStatus
    from topas.timing import linear_cost
    from topas_sglang.controller import HOST_TIER, host_prefix_len

    teach = [stage_req(Task(f"k{a}", 0.0, (Stage("s", a, 4, 1),)), "s") for a in PROMPTS]
    seen = {}
    for hicache in (False, True):
        cache = make_cache("topas")
        for agent in ("pm", "eng"):
            cache_prompt(cache, PROMPTS[agent])
        controller = controller_of(cache)
        if hicache:
            cache.tree_core.set_hicache_enabled()
            node = cache.tree_core.root_node
            while node.children:  # down pm's prompt (its own branch: prompts are disjoint)
                node = next(
                    n for n in node.children.values() if n.key.token_ids[0] in PROMPTS["pm"]
                )
                data = node.component_data[ComponentType.FULL]
                data.host_value, data.value = data.value.clone(), None
            key = RadixKey(array("q", PROMPTS["pm"]))
            assert host_prefix_len(cache.tree_core, key, 1) == len(PROMPTS["pm"])
            assert cached_len(cache, PROMPTS["pm"]) == 0  # not on the device
        _queue(schedule_policy(cache), teach)  # the controller learns the three prompts
        state = controller._state(observe(teach, [], {}), time.perf_counter())
        seen[hicache] = {a: (p.status, p.host_copy) for a, p in state.prefixes.items()}
        if hicache:
            assert isinstance(controller._server_spec().prefix_load, HostLoad)
            policy = controller._policy_for(state)
            pred = policy._pred
            swap = pred.load(state, "pm")
            assert swap == pytest.approx(HOST_TIER.swap_s(len(PROMPTS["pm"])))
            per_token = linear_cost(controller._server_spec()).prefill_token_s
            assert pred.load(state, "qa") == pytest.approx(len(PROMPTS["qa"]) * per_token)
            assert 0 < swap < len(PROMPTS["pm"]) * per_token  # the swap is the cheaper way
    here, gone = PrefixStatus.RESIDENT, PrefixStatus.ABSENT
    assert seen[False] == {"pm": (here, None), "eng": (here, None), "qa": (gone, None)}
    assert seen[True] == {"pm": (gone, True), "eng": (here, True), "qa": (gone, False)}


# ---------------------------------------------------------------------- finish signals


def test_a_stage_is_finished_only_on_sglangs_finish_signal():
    # t0 is a -> b. Round 1 sees a queued. Then a is in neither queue nor batch, as while
    # SGLang prefills it in chunks, or after an abort: not finished, so b is not yet
    # counted ready. Released unfinished (a retraction) or aborted: still not finished.
    # Released with a finish reason (the cache's on_release, hooked): finished.
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH

    t0 = Task("t0", 0.0, (Stage("a", "pm", 8, 2), Stage("b", "eng", 8, 2, ("a",))))
    t1 = Task("t1", 0.0, (Stage("c", "qa", 8, 2),))
    cache = make_cache("topas")
    policy, controller = schedule_policy(cache), controller_of(cache)
    a, c = stage_req(t0, "a"), stage_req(t1, "c")
    _queue(policy, [a, c])
    _queue(policy, [c, make_req("x", [1])])  # a is gone: no signal, not finished
    assert controller.finished.get("t0", set()) == set()
    cache.on_release(a, checkpointed=False)  # retracted: released unfinished
    a.finished_reason = FINISH_ABORT("client went away")
    cache.on_release(a, checkpointed=False)
    assert controller.finished.get("t0", set()) == set() and controller.stats.finished == 0
    a.finished_reason = FINISH_LENGTH(length=2)
    cache.on_release(a, checkpointed=True)  # SGLang's finish signal
    assert controller.finished["t0"] == {"a"} and controller.stats.finished == 1
    b = stage_req(t0, "b")
    _queue(policy, [c, b])  # b is sent: a stays finished, no reappearance
    assert controller.finished["t0"] == {"a"} and controller.stats.reappeared == 0
    lru = make_cache("lru")
    lru.on_release(a, checkpointed=True)  # SGLang alone: the hook passes through
    assert controller_of(lru) is None


# ---------------------------------------------------------------------- retraction


def test_retraction_order_follows_topas_for_tagged_requests():
    # Three running stages and one untagged request. SGLang retracts the fewest-decoded
    # first; the plugin refills the tagged slots with TOPAS's retraction order.
    long = Task("tl", 0.0, tuple(Stage(f"s{i}", "pm", 8, 50, (f"s{i-1}",) if i else ())
                                  for i in range(6)))  # fmt: skip
    short = Task("ts", 0.0, (Stage("a", "eng", 8, 50),))
    mid = Task("tm", 0.0, (Stage("a", "qa", 8, 50), Stage("b", "qa", 8, 50, ("a",))))
    running = [stage_req(long, "s0"), make_req("plain", [5, 6]), stage_req(short, "a"),
               stage_req(mid, "a")]  # fmt: skip
    for req, n in zip(running, (30, 5, 10, 20), strict=True):
        req.output_ids.extend(range(n))
    original = ScheduleBatch._get_decode_retraction_order.__wrapped__(running)
    cache = make_cache("topas")
    ref = Reference(cache)
    _queue(schedule_policy(cache), [stage_req(long, "s0")])  # the scheduler's first round
    ref.decide([stage_req(long, "s0")])
    order = ScheduleBatch._get_decode_retraction_order(running)
    victims = ["/".join(r) for r in ref.retraction_order(running)]  # first to retract first
    assert [running[i].rid for i in original] == ["tl/s0", "tm/a", "ts/a", "plain"]
    assert running[order[3]].rid == "plain"  # the untagged request keeps its slot
    tagged = [running[i].rid for i in order if running[i].rid != "plain"]
    assert tagged == victims[::-1]
    assert tagged != ["tl/s0", "tm/a", "ts/a"]  # not SGLang's order: TOPAS's
    assert sorted(order) == [0, 1, 2, 3]


# ---------------------------------------------------------------------- the client


def test_client_payloads_pass_sglangs_own_request_classes():
    from sglang.srt.managers.io_struct import (
        GenerateReqInput,
        TokenizedGenerateReqInput,
        msgpack_decode,
        msgpack_encode,
    )
    from sglang.srt.sampling.sampling_params import SamplingParams

    from topas.serve_bench import prefix_ids, stage_payload
    from topas.workflow_metadata import decode
    from topas.workloads import generate

    inst = generate("metagpt-sop", num_tasks=2, seed=0)
    prefixes = prefix_ids(inst)
    task = inst.tasks[0]
    for stage in task.stages:
        body = stage_payload(inst, task, stage.id, prefixes)
        req = GenerateReqInput(**body)
        req.normalize_batch_and_arguments()
        assert req.routing_key == task.id  # SGLang's own field: a router keys on it
        params = SamplingParams(**req.sampling_params)
        params.normalize(None)
        params.verify(vocab_size=128256)
        wire = TokenizedGenerateReqInput(
            rid=req.rid, input_text="", input_ids=array("q", req.input_ids),
            input_embeds=None, mm_inputs=None, token_type_ids=None, sampling_params=params,
            return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
            token_ids_logprob=None, stream=False,
        )  # fmt: skip
        got = msgpack_decode(msgpack_encode(wire))  # the tokenizer -> scheduler IPC
        meta = decode(got.sampling_params.custom_params)
        assert meta.ref == (task.id, stage.id) and got.sampling_params.max_new_tokens == (
            stage.output_tokens
        )


def test_openai_completions_carry_the_metadata_to_the_scheduler():
    # /v1/completions with token ids and custom_params at the top level of the body
    # (the openai client's extra_body) fills the same sampling params as /generate
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.sampling.sampling_params import SamplingParams

    from topas.workflow_metadata import decode

    task = Task("t0", 0.0, (Stage("a", "pm", 8, 5), Stage("b", "eng", 8, 3, ("a",))))
    meta = encode(task, "b", len(PROMPTS["eng"]))
    body = {"model": "dummy", "prompt": PROMPTS["eng"] + [7] * 8, "max_tokens": 3,
            "ignore_eos": True, "custom_params": meta}  # fmt: skip
    request = CompletionRequest(**body)
    params = SamplingParams(**OpenAIServingCompletion._build_sampling_params(None, request))
    params.normalize(None)
    assert decode(params.custom_params).ref == ("t0", "b") and params.max_new_tokens == 3


@pytest.mark.parametrize("flag", ["--dp-size", "--pp-size"])
def test_data_and_pipeline_parallelism_are_refused_at_start_with_one_line(flag):
    # the plan is shared across one tensor-parallel group (topas_sglang.ranks); several
    # schedulers (dp) or micro-batches in flight (pp) are untested and stop the server
    from sglang.srt.server_args import prepare_server_args

    from topas_sglang.plugin import UnsupportedSetting

    args = prepare_server_args(["--model-path", "dummy", flag, "2",
                                "--radix-eviction-policy", "topas"])  # fmt: skip
    with pytest.raises(UnsupportedSetting, match=f"does not support {flag} 2") as err:
        args.check_server_args()  # hooked: the plugin's check runs first
    assert "\n" not in str(err.value)
    plain = prepare_server_args(["--model-path", "dummy", flag, "2"])
    _not_refused_by_the_plugin(plain)


def test_tensor_parallelism_passes_the_plugins_start_up_check():
    # every TP rank takes rank 0's plan (test_ranks.py shows they decide alike)
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", "dummy", "--tp-size", "2",
                                "--radix-eviction-policy", "topas"])  # fmt: skip
    _not_refused_by_the_plugin(args)


def _not_refused_by_the_plugin(args) -> None:  # type: ignore[no-untyped-def]
    from topas_sglang.plugin import UnsupportedSetting

    try:  # SGLang's own checks may still object (no model, no GPU)
        args.check_server_args()
    except UnsupportedSetting:  # pragma: no cover
        pytest.fail("the plugin refused a server it supports")
    except Exception:  # noqa: BLE001, S110
        pass


def test_a_cache_topas_cannot_attach_to_is_reported_at_start(monkeypatch, caplog):
    # --radix-eviction-policy topas with a cache that has no topas strategy (the disabled
    # cache of --disable-radix-cache, or another registered backend's): one warning naming
    # the cache; with the unified cache SGLang builds for topas, none
    import logging

    from topas_sglang import hooks

    monkeypatch.setattr(hooks, "topas_configured", lambda: True)

    class ChunkCache:  # a cache without the topas strategy
        pass

    with caplog.at_level(logging.WARNING, logger="topas_sglang"):
        got = hooks.tree_cache_built(lambda ctx: ChunkCache(), None)
    assert isinstance(got, ChunkCache)
    assert "the ChunkCache that SGLang built has no topas eviction strategy" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="topas_sglang"):
        hooks.tree_cache_built(lambda ctx: make_cache("topas"), None)
    assert "no topas eviction strategy" not in caplog.text
