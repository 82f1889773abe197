"""Workload generators: validity, determinism, DAG shapes, calibration, arrivals, scaling."""

from __future__ import annotations

import math
import statistics

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas.instance import Agent, Instance, LinearCost, ServerSpec, Stage, StepCost, Task
from topas.timing import DEFAULT_LINEAR
from topas.workloads import (
    WORKLOADS,
    decode_regime,
    describe,
    expected_sop_tokens,
    generate,
    mean_task_demand_s,
    small_instance,
    task_demand_s,
)
from topas.workloads.metagpt import PAPER_COMPLETION_TOKENS, PAPER_PROMPT_TOKENS

FAMILIES = ["chain", "fanout", "mixed", "metagpt-sop", "metagpt-tl"]


def prefix_sum(inst: Instance) -> int:
    return sum(a.prefix_tokens for a in inst.agents)


# --------------------------------------------------------------------------- every family


def test_registry_has_the_five_families():
    assert set(FAMILIES) <= set(WORKLOADS)  # the paper's five are in test_paper_workloads
    for name, wl in WORKLOADS.items():
        assert wl.name == name


@pytest.mark.parametrize("name", FAMILIES)
def test_generates_a_valid_instance(name):
    inst = generate(name, num_tasks=30, seed=1)
    assert isinstance(inst, Instance)
    assert [t.id for t in inst.tasks] == [f"t{i}" for i in range(30)]
    assert all(t.workflow == name for t in inst.tasks)
    assert inst.name == f"{name}-n30-load0.8-seed1"
    assert inst.server.cost_model == DEFAULT_LINEAR  # the default profile's, recorded
    assert inst.server.profile is not None and inst.server.profile.name == "llama-3-8b/h100"
    assert inst.server.chunk_tokens == 2048
    assert inst.server.max_running is None
    assert inst.server.prefix_load.kind == "recompute"
    arrivals = [t.arrival for t in inst.tasks]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    assert all(round(a, 6) == a for a in arrivals)
    # JSON round trip gives the same instance.
    assert Instance.from_dict(inst.to_dict()) == inst


@pytest.mark.parametrize("name", FAMILIES)
def test_deterministic_for_a_seed(name):
    a = generate(name, num_tasks=20, seed=7)
    b = generate(name, num_tasks=20, seed=7)
    assert a.to_json() == b.to_json()


@pytest.mark.parametrize("name", FAMILIES)
def test_different_seeds_differ(name):
    a = generate(name, num_tasks=20, seed=1)
    b = generate(name, num_tasks=20, seed=2)
    assert a.to_dict()["tasks"] != b.to_dict()["tasks"]
    assert a.to_dict()["agents"] != b.to_dict()["agents"]


@pytest.mark.parametrize("name", FAMILIES)
def test_kv_tradeoff_present_by_default(name):
    """All prefixes together take 30-70% of the default KV budget."""
    for seed in range(5):
        inst = generate(name, num_tasks=5, seed=seed)
        share = prefix_sum(inst) / inst.server.kv_capacity_tokens
        assert 0.3 <= share <= 0.7, (seed, share)


# --------------------------------------------------------------------------- DAG shapes


def test_chain_is_a_path_with_cyclic_agents():
    inst = generate("chain", num_tasks=40, seed=3)
    n_agents = len(inst.agents)
    for t in inst.tasks:
        assert 3 <= len(t.stages) <= 8
        for i, s in enumerate(t.stages):
            assert s.id == f"s{i}"
            assert s.deps == (() if i == 0 else (f"s{i - 1}",))
            assert s.agent == f"agent{i % n_agents}"
        g = t.graph
        assert nx.is_directed_acyclic_graph(g)
        assert g.number_of_edges() == len(t.stages) - 1
        assert all(g.in_degree(v) <= 1 and g.out_degree(v) <= 1 for v in g)


def test_chain_random_agent_order():
    inst = generate("chain", num_tasks=40, seed=3, agent_order="random", num_agents=5)
    assert len(inst.agents) == 5
    cyclic = all(s.agent == f"agent{i % 5}" for t in inst.tasks for i, s in enumerate(t.stages))
    assert not cyclic


def test_fanout_one_sink_depending_on_all_mappers():
    inst = generate("fanout", num_tasks=40, seed=4)
    for t in inst.tasks:
        g = t.graph
        sinks = [v for v in g if g.out_degree(v) == 0]
        assert sinks == ["reduce"]
        maps = [s.id for s in t.stages if s.id.startswith("map")]
        assert 2 <= len(maps) <= 6
        assert set(t.stage_by_id["reduce"].deps) == set(maps)
        assert all(t.stage_by_id[m].deps == ("plan",) for m in maps)
        assert t.stage_by_id["plan"].deps == ()
        # mapper_agents=same: one worker agent per task, not the planner's.
        assert len({t.stage_by_id[m].agent for m in maps}) == 1
        assert t.stage_by_id[maps[0]].agent != "agent0"


def test_fanout_two_levels():
    inst = generate("fanout", num_tasks=20, seed=5, levels=2, mapper_agents="different")
    for t in inst.tasks:
        g = t.graph
        assert [v for v in g if g.out_degree(v) == 0] == ["reduce"]
        maps = [s.id for s in t.stages if s.id.startswith("map")]
        merges = [s.id for s in t.stages if s.id.startswith("merge")]
        assert 2 <= len(merges) <= 3
        assert set(t.stage_by_id["reduce"].deps) == set(merges)
        assert all("reduce" in nx.descendants(g, m) for m in maps)


def test_mixed_every_non_root_has_a_dep_in_the_layer_above():
    inst = generate("mixed", num_tasks=40, seed=6)
    for t in inst.tasks:
        g = t.graph
        assert nx.is_directed_acyclic_graph(g)
        roots = [s for s in t.stages if not s.deps]
        assert roots and roots == list(t.stages[: len(roots)])  # the first layer
        for s in t.stages[len(roots) :]:
            assert s.deps
        # longest path has at most max_layers stages; sinks are in the last layer
        assert nx.dag_longest_path_length(g) + 1 <= 5
        assert sum(g.out_degree(v) == 0 for v in g) <= 4


def test_metagpt_sop_shape():
    inst = generate("metagpt-sop", num_tasks=60, seed=8)
    assert [a.id for a in inst.agents] == ["pm", "architect", "pjm", "engineer", "qa"]
    for t in inst.tasks:
        g = t.graph
        assert [v for v in g if g.in_degree(v) == 0] == ["prd"]
        by = t.stage_by_id
        assert by["prd"].agent == "pm" and by["design"].deps == ("prd",)
        assert by["tasks"].deps == ("design",) and by["tasks"].agent == "pjm"
        codes = [s.id for s in t.stages if s.id.startswith("code_f")]
        assert codes and codes[0] == "code_f1"
        assert all(by[c].agent == "engineer" for c in codes)
        for s in t.stages:
            kind = s.id.split("_")[0]
            if kind in ("code", "review", "rewrite", "fix"):
                assert s.agent == "engineer"
            if kind == "qa":
                assert s.agent == "qa"
        # every code stage precedes QA
        assert all(nx.has_path(g, c, "qa_1") for c in codes)
        # QA/fix loop: qa_k -> fix_k -> qa_{k+1}
        fixes = [s.id for s in t.stages if s.id.startswith("fix_")]
        for k in range(1, len(fixes) + 1):
            assert by[f"fix_{k}"].deps == (f"qa_{k}",)
            assert by[f"qa_{k + 1}"].deps == (f"fix_{k}",)
        # sequential files (MetaGPT's Engineer): the stages form one path
        assert g.number_of_edges() == len(t.stages) - 1


def test_metagpt_sop_parallel_files():
    inst = generate("metagpt-sop", num_tasks=40, seed=9, parallel_files=True)
    multi = 0
    for t in inst.tasks:
        codes = [s for s in t.stages if s.id.startswith("code_f")]
        assert all(c.deps == ("tasks",) for c in codes)
        assert len(t.stage_by_id["qa_1"].deps) == len(codes)
        multi += len(codes) > 1
    assert multi > 0


def test_metagpt_tl_alternates_worker_and_review():
    inst = generate("metagpt-tl", num_tasks=60, seed=10)
    assert [a.id for a in inst.agents] == ["tl", "pm", "architect", "engineer", "data_analyst"]
    tl = inst.agent_by_id["tl"].prefix_tokens
    assert 6000 <= tl <= 8000
    assert all(2000 <= a.prefix_tokens <= 4000 for a in inst.agents if a.id != "tl")
    for t in inst.tasks:
        by = t.stage_by_id
        assert t.stages[0].id == "tl_plan" and t.stages[0].deps == ()
        workers = [s for s in t.stages if s.agent != "tl"]
        assert workers
        for w in workers:
            # dispatched after a TeamLeader call, reviewed by the TeamLeader
            assert len(w.deps) == 1 and by[w.deps[0]].agent == "tl"
            kids = t.children[w.id]
            assert len(kids) == 1 and by[kids[0]].agent == "tl"
            assert kids[0].startswith("tl_review_")
        agents = [by[v].agent for v in nx.topological_sort(t.graph)]
        assert agents[::2] == ["tl"] * len(agents[::2])  # tl, w, tl, w, ..., tl
        assert "tl" not in agents[1::2]


# --------------------------------------------------------------------------- calibration


def test_metagpt_sop_matches_the_paper_totals():
    """Over 200 projects: completion tokens within 25% of the paper's ~6.2K; prompt tokens,
    counted per call as the agent's prefix plus the call's input (what an API bills), of the
    order of the paper's ~26.6K (within a factor 2; ~30K by construction)."""
    inst = generate("metagpt-sop", num_tasks=200, seed=0)
    prefix = {a.id: a.prefix_tokens for a in inst.agents}
    completion = statistics.mean(sum(s.output_tokens for s in t.stages) for t in inst.tasks)
    prompt = statistics.mean(
        sum(prefix[s.agent] + s.input_tokens for s in t.stages) for t in inst.tasks
    )
    assert abs(completion - PAPER_COMPLETION_TOKENS) <= 0.25 * PAPER_COMPLETION_TOKENS
    assert 0.5 * PAPER_PROMPT_TOKENS <= prompt <= 2.0 * PAPER_PROMPT_TOKENS
    files = statistics.mean(sum(s.id.startswith("code_f") for s in t.stages) for t in inst.tasks)
    assert abs(files - 4.7) < 0.6
    expected = expected_sop_tokens()
    assert abs(expected["completion"] - PAPER_COMPLETION_TOKENS) < 0.05 * PAPER_COMPLETION_TOKENS
    assert abs(completion - expected["completion"]) < 0.15 * expected["completion"]


# --------------------------------------------------------------------------- predictions


def test_prediction_sigma():
    plain = generate("chain", num_tasks=20, seed=11)
    assert all(s.predicted_output_tokens is None for t in plain.tasks for s in t.stages)
    noisy = generate("chain", num_tasks=20, seed=11, prediction_sigma=0.5)
    pairs = [(s.output_tokens, s.predicted_output_tokens) for t in noisy.tasks for s in t.stages]
    assert all(p is not None and p >= 1 for _, p in pairs)
    assert sum(o != p for o, p in pairs) > len(pairs) // 2
    # the truth and the arrivals do not move
    strip = [
        [(s.id, s.agent, s.input_tokens, s.output_tokens, s.deps) for s in t.stages]
        for t in noisy.tasks
    ]
    assert strip == [
        [(s.id, s.agent, s.input_tokens, s.output_tokens, s.deps) for s in t.stages]
        for t in plain.tasks
    ]
    assert [t.arrival for t in noisy.tasks] == [t.arrival for t in plain.tasks]
    again = generate("chain", num_tasks=20, seed=11, prediction_sigma=0.5)
    assert again.to_json() == noisy.to_json()


# --------------------------------------------------------------------------- arrivals


def mean_gap(inst: Instance) -> float:
    a = [t.arrival for t in inst.tasks]
    return (a[-1] - a[0]) / (len(a) - 1)


def test_load_halves_the_interarrival():
    lo = generate("fanout", num_tasks=400, seed=12, load=0.5)
    hi = generate("fanout", num_tasks=400, seed=12, load=1.0)
    assert mean_gap(lo) / mean_gap(hi) == pytest.approx(2.0, rel=0.01)
    # and the rate is load / mean demand
    demand = mean_task_demand_s(hi.tasks, hi.agent_by_id, hi.server)
    assert mean_gap(hi) == pytest.approx(demand, rel=0.15)


def test_rate_and_load_are_exclusive_and_rate_works():
    with pytest.raises(ValueError, match="mutually exclusive"):
        generate("chain", num_tasks=3, load=0.5, rate=1.0)
    inst = generate("chain", num_tasks=300, seed=13, rate=2.0)
    assert inst.name == "chain-n300-rate2-seed13"
    assert mean_gap(inst) == pytest.approx(0.5, rel=0.15)


def test_server_overrides():
    inst = generate(
        "metagpt-tl", num_tasks=5, kv_capacity_tokens=100_000, max_running=32, chunk_tokens=8192
    )
    assert inst.server.kv_capacity_tokens == 100_000
    assert inst.server.max_running == 32
    assert inst.server.chunk_tokens == 8192


# --------------------------------------------------------------------------- demand


def test_task_demand_by_hand():
    # One agent (prefix 1000), two stages: (input 500, output 100) and (input 300, output 300).
    agents = {"a": Agent("a", 1000)}
    task = Task("t0", 0.0, (Stage("x", "a", 500, 100), Stage("y", "a", 300, 300, deps=("x",))))
    cost = LinearCost(base_s=0.01, prefill_token_s=1e-4, decode_seq_s=1e-3, kv_token_s=1e-6)
    server = ServerSpec(kv_capacity_tokens=3400, chunk_tokens=256, cost_model=cost)
    # mean per-sequence KV = (600 + 600)/2 = 600; beside the resident prefix (1000):
    # b = floor((3400 - 1000)/600) = 4
    # c = mean(1000+500+50, 1000+300+150) = 1500
    reg = decode_regime(task.stages, agents, server)
    assert (reg.batch, reg.context) == (4, 1500)
    # prefill: (500 + 300 + 1000 once) * 1e-4 = 0.18
    # decode per token: (0.01 + 1e-3*4 + 1e-6*4*1500) / 4 = 0.005; 400 tokens -> 2.0
    assert task_demand_s(task, agents, server) == pytest.approx(0.18 + 2.0)
    capped = ServerSpec(kv_capacity_tokens=3400, chunk_tokens=256, max_running=2, cost_model=cost)
    assert decode_regime(task.stages, agents, capped).batch == 2
    # step model: durations ceil(500/256)+100 = 102, ceil(300/256)+300 = 302, load ceil(1000/256)
    # = 4; b = 4 -> (102 + 302 + 4) / 4 = 102 steps
    step = ServerSpec(kv_capacity_tokens=3400, chunk_tokens=256, cost_model=StepCost(1.0))
    assert task_demand_s(task, agents, step) == pytest.approx(102.0)


def test_default_cost_model_is_used():
    from topas.timing import DEFAULT_LINEAR

    inst = generate("chain", num_tasks=5, seed=1)
    explicit = ServerSpec(
        kv_capacity_tokens=inst.server.kv_capacity_tokens,
        chunk_tokens=inst.server.chunk_tokens,
        cost_model=DEFAULT_LINEAR,
    )
    t = inst.tasks[0]
    assert task_demand_s(t, inst.agent_by_id, inst.server) == pytest.approx(
        task_demand_s(t, inst.agent_by_id, explicit)
    )


# --------------------------------------------------------------------------- scaling, small


def test_token_scale_and_step_timing():
    base = generate("chain", num_tasks=10, seed=14)
    scaled = generate("chain", num_tasks=10, seed=14, token_scale=10, timing="step")
    assert scaled.server.cost_model == StepCost(1.0)
    assert scaled.server.chunk_tokens == math.ceil(2048 / 10)
    assert scaled.server.kv_capacity_tokens >= math.ceil(base.server.kv_capacity_tokens / 10)
    for a, b in zip(base.agents, scaled.agents, strict=True):
        assert b.prefix_tokens == max(1, math.ceil(a.prefix_tokens / 10))
    for ta, tb in zip(base.tasks, scaled.tasks, strict=True):
        for sa, sb in zip(ta.stages, tb.stages, strict=True):
            assert sb.input_tokens == max(1, math.ceil(sa.input_tokens / 10))
            assert sb.output_tokens == max(1, math.ceil(sa.output_tokens / 10))
        assert isinstance(tb.arrival, int)
    assert scaled.name.endswith("-scale10-step")


@pytest.mark.parametrize("name", FAMILIES)
def test_small_instance_sizes(name):
    for seed in range(4):
        for n in (2, 3, 4):
            inst = small_instance(name, seed, num_tasks=n)
            assert len(inst.tasks) == n
            assert 2 <= len(inst.agents) <= 4
            assert 6 <= inst.num_stages <= 20
            assert inst.server.cost_model == StepCost(1.0)
            chunk = inst.server.chunk_tokens
            for t in inst.tasks:
                assert isinstance(t.arrival, int) and 0 <= t.arrival <= 80
                for s in t.stages:
                    assert 1 <= math.ceil(s.input_tokens / chunk) + s.output_tokens <= 40
            for a in inst.agents:
                assert 1 <= math.ceil(a.prefix_tokens / chunk) <= 5
            # the tradeoff binds: all prefixes plus only a few average stages fit
            assert prefix_sum(inst) >= 0.3 * inst.server.kv_capacity_tokens
            mean_kv = statistics.mean(
                s.input_tokens + s.output_tokens for t in inst.tasks for s in t.stages
            )
            free = inst.server.kv_capacity_tokens - prefix_sum(inst)
            assert free <= 4 * mean_kv


def test_small_instance_options():
    a = small_instance("metagpt-sop", 1)
    assert a.to_json() == small_instance("metagpt-sop", 1).to_json()
    b = small_instance("metagpt-sop", 1, kv_capacity_tokens=500, max_running=2)
    assert b.server.kv_capacity_tokens == 500 and b.server.max_running == 2
    c = small_instance("chain", 1, num_tasks=3, max_stages=3)
    assert all(len(t.stages) == 3 for t in c.tasks)


# --------------------------------------------------------------------------- errors


def test_unknown_name():
    with pytest.raises(ValueError, match="unknown workload 'nope'.*chain.*metagpt-tl"):
        generate("nope")
    with pytest.raises(ValueError, match="unknown workload"):
        describe("nope")
    with pytest.raises(ValueError, match="unknown workload"):
        small_instance("nope", 0)


def test_unknown_or_bad_param():
    with pytest.raises(ValueError, match="unknown parameter 'bogus' for workload 'chain'.*max_st"):
        generate("chain", bogus=1)
    with pytest.raises(ValueError, match="agent_order.*cyclic, random"):
        generate("chain", agent_order="zigzag")
    with pytest.raises(ValueError, match="min_stages"):
        generate("chain", min_stages=5, max_stages=2)
    with pytest.raises(ValueError, match="timing"):
        generate("chain", timing="fast")
    with pytest.raises(ValueError, match="num_tasks"):
        generate("chain", num_tasks=0)
    with pytest.raises(ValueError, match="parameter num_agents"):
        generate("chain", num_agents="many")


def test_params_from_strings_like_a_cli():
    x = generate("fanout", num_tasks=5, seed=2, levels="2", max_mappers="3")
    y = generate("fanout", num_tasks=5, seed=2, levels=2, max_mappers=3)
    assert x.to_json() == y.to_json()
    z = generate("metagpt-sop", num_tasks=5, seed=2, parallel_files="true")
    w = generate("metagpt-sop", num_tasks=5, seed=2, parallel_files=True)
    assert z.to_json() == w.to_json()


@pytest.mark.parametrize("name", FAMILIES)
def test_describe_lists_every_param(name):
    text = describe(name)
    assert text.startswith(f"{name}: ")
    for k in WORKLOADS[name].params:
        assert f"  {k} = " in text
    assert "prefix_share" in text


# --------------------------------------------------------------------------- property


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(FAMILIES),
    seed=st.integers(0, 10**6),
    num_tasks=st.integers(1, 6),
    token_scale=st.sampled_from([1.0, 4.0, 64.0]),
    timing=st.sampled_from(["calibrated", "step"]),
    sigma=st.sampled_from([0.0, 0.3]),
)
def test_any_seed_gives_a_valid_instance(name, seed, num_tasks, token_scale, timing, sigma):
    inst = generate(
        name,
        num_tasks=num_tasks,
        seed=seed,
        token_scale=token_scale,
        timing=timing,
        prediction_sigma=sigma,
    )
    cap = inst.server.kv_capacity_tokens
    prefix = {a.id: a.prefix_tokens for a in inst.agents}
    assert len(inst.tasks) == num_tasks
    for t in inst.tasks:
        assert nx.is_directed_acyclic_graph(t.graph)
        if name != "mixed":  # a layered DAG may be two parallel strands
            assert nx.is_weakly_connected(t.graph)
        for s in t.stages:
            assert prefix[s.agent] + s.input_tokens + s.output_tokens <= cap
            assert (s.predicted_output_tokens is None) == (sigma == 0)
    assert prefix_sum(inst) >= 0.3 * cap
    demand = mean_task_demand_s(inst.tasks, inst.agent_by_id, inst.server)
    assert demand > 0 and math.isfinite(demand)
    assert Instance.from_dict(inst.to_dict()) == inst
