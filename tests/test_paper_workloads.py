"""The TOPAS paper's five workloads (topas/workloads/paper.py): shapes, defaults, overrides,
small instances and the measured MetaGPT prompt sizes."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import networkx as nx
import pytest

from topas.instance import Instance, StepCost
from topas.profiles import QWEN_A100_KV_TOKENS, get_profile
from topas.workloads import WORKLOADS, ServerDefaults, describe, generate, small_instance
from topas.workloads._common import DEFAULT_PREFIX_SHARE, default_server
from topas.workloads.paper import (
    CHAIN3_PREFIX_TOKENS,
    DAG4_PREFIX_TOKENS,
    DAG10_NUM_AGENTS,
    DAG10_PREFIX_TOKENS,
    DAG10_WIDTH,
    PAPER_KV_BUDGET,
    PAPER_PROFILE,
    REQUIREMENT_MAX_TOKENS,
    REQUIREMENT_MIN_TOKENS,
    SOP_PROMPT_TOKENS,
    STAGE_INPUT_TOKENS,
    STAGE_OUTPUT_TOKENS,
    TL_PROMPT_TOKENS,
)

PAPER = ["chain-3", "dag-4", "dag-10-wide", "metagpt-sop-paper", "metagpt-tl-paper"]
SYNTHETIC = ["chain-3", "dag-4", "dag-10-wide"]
DOCS = Path(__file__).resolve().parents[1] / "docs" / "workloads.md"


def prefixes(inst: Instance) -> dict[str, int]:
    return {a.id: a.prefix_tokens for a in inst.agents}


# --------------------------------------------------------------------------- every family


def test_registered_with_the_paper_profile():
    for name in PAPER:
        wl = WORKLOADS[name]
        assert wl.name == name
        assert wl.profile == PAPER_PROFILE == "qwen2.5-32b/a100-80gb"


@pytest.mark.parametrize("name", PAPER)
def test_generates_deterministically(name):
    a = generate(name, num_tasks=20, seed=3)
    b = generate(name, num_tasks=20, seed=3)
    assert a.to_json() == b.to_json()
    assert len(a.tasks) == 20 and all(t.workflow == name for t in a.tasks)
    assert a.server.profile is not None and a.server.profile.name == PAPER_PROFILE
    assert Instance.from_dict(a.to_dict()) == a
    cap = a.server.kv_capacity_tokens
    p = prefixes(a)
    for t in a.tasks:
        g = t.graph
        assert nx.is_directed_acyclic_graph(g) and nx.is_weakly_connected(g)
        for s in t.stages:
            assert s.predicted_output_tokens is None  # policies are told the truth
            assert p[s.agent] + s.input_tokens + s.output_tokens <= cap


@pytest.mark.parametrize("name", PAPER)
def test_describe_lists_every_param(name):
    text = describe(name)
    for k in WORKLOADS[name].params:
        assert f"  {k} = " in text
        assert WORKLOADS[name].param_help[k]


# --------------------------------------------------------------------------- synthetic


@pytest.mark.parametrize("name", SYNTHETIC)
def test_synthetic_lengths_are_fixed(name):
    inst = generate(name, num_tasks=20, seed=3)
    lengths = {(s.input_tokens, s.output_tokens) for t in inst.tasks for s in t.stages}
    assert lengths == {(STAGE_INPUT_TOKENS, STAGE_OUTPUT_TOKENS)} == {(512, 256)}
    # every task is the same DAG; only arrivals depend on the seed
    assert len({t.stages for t in inst.tasks}) == 1
    other = generate(name, num_tasks=20, seed=4)
    assert other.tasks[0].stages == inst.tasks[0].stages
    assert [t.arrival for t in other.tasks] != [t.arrival for t in inst.tasks]


def test_chain3_shape_and_defaults():
    assert WORKLOADS["chain-3"].params == {
        "length": 3,
        "num_agents": 3,
        "prefix_tokens": 4096,
        "input_tokens": 512,
        "output_tokens": 256,
    }
    assert CHAIN3_PREFIX_TOKENS == 4096
    inst = generate("chain-3", num_tasks=20, seed=3)
    assert prefixes(inst) == {"agent0": 4096, "agent1": 4096, "agent2": 4096}
    for t in inst.tasks:
        assert [(s.id, s.agent, s.deps) for s in t.stages] == [
            ("s0", "agent0", ()),
            ("s1", "agent1", ("s0",)),
            ("s2", "agent2", ("s1",)),
        ]


def test_dag4_is_a_diamond():
    assert WORKLOADS["dag-4"].params["prefix_tokens"] == DAG4_PREFIX_TOKENS == 3072
    inst = generate("dag-4", num_tasks=20, seed=3)
    assert prefixes(inst) == {f"agent{i}": 3072 for i in range(4)}
    for t in inst.tasks:
        assert {s.id: (s.agent, set(s.deps)) for s in t.stages} == {
            "a": ("agent0", set()),
            "b": ("agent1", {"a"}),
            "c": ("agent2", {"a"}),
            "d": ("agent3", {"b", "c"}),
        }


def test_dag10_wide_is_one_eight_one():
    assert (DAG10_WIDTH, DAG10_NUM_AGENTS, DAG10_PREFIX_TOKENS) == (8, 4, 3072)
    assert WORKLOADS["dag-10-wide"].params["prefix_tokens"] == 3072
    inst = generate("dag-10-wide", num_tasks=20, seed=3)
    assert prefixes(inst) == {f"agent{i}": 3072 for i in range(4)}
    for t in inst.tasks:
        by = t.stage_by_id
        wide = [f"w{i}" for i in range(1, 9)]
        assert [s.id for s in t.stages] == ["root", *wide, "join"]
        assert by["root"].deps == () and by["root"].agent == "agent0"
        assert set(by["join"].deps) == set(wide) and by["join"].agent == "agent0"
        assert all(by[w].deps == ("root",) for w in wide)
        assert [by[w].agent for w in wide] == [f"agent{1 + i % 3}" for i in range(8)]
        assert Counter(by[w].agent for w in wide) == {"agent1": 3, "agent2": 3, "agent3": 2}
        assert nx.dag_longest_path_length(t.graph) == 2


def test_the_budget_is_the_paper_profiles():
    """The defaults are sized against the profile's SGLang v0.5.3 budget, not a guess."""
    assert PAPER_KV_BUDGET == QWEN_A100_KV_TOKENS == 18_939
    assert get_profile(PAPER_PROFILE).kv_capacity_tokens == QWEN_A100_KV_TOKENS
    assert generate("chain-3", num_tasks=5, seed=0).server.kv_capacity_tokens == QWEN_A100_KV_TOKENS
    for name in PAPER:
        inst = generate(name, num_tasks=5, seed=0)
        assert inst.server.kv_capacity_tokens == QWEN_A100_KV_TOKENS
        # an explicit budget still wins
        inst = generate(name, num_tasks=5, seed=0, kv_capacity_tokens=37_000)
        assert inst.server.kv_capacity_tokens == 37_000


def test_server_defaults_are_the_common_ones():
    """No family-specific prefix_share: without a profile budget the common rule applies."""
    for name in PAPER:
        wl = WORKLOADS[name]
        assert wl.server == ServerDefaults()
        inst = generate(name, num_tasks=5, seed=0, profile="llama-3-8b/h100")
        assert inst.server.profile is not None and inst.server.profile.name == "llama-3-8b/h100"
        rule = default_server(inst.agents, ServerDefaults(), DEFAULT_PREFIX_SHARE)
        assert inst.server.kv_capacity_tokens == rule.kv_capacity_tokens
        assert wl.default_server(inst.agents).kv_capacity_tokens == rule.kv_capacity_tokens
    # the synthetic prompts' 12,288 tokens at share 0.5: 24,576
    chain = generate("chain-3", num_tasks=5, seed=0, profile="llama-3-8b/h100")
    assert chain.server.kv_capacity_tokens == 24_576
    # an explicit prefix_share sizes the budget even on the paper profile
    inst = generate("chain-3", num_tasks=5, seed=0, prefix_share=0.25)
    assert inst.server.kv_capacity_tokens == 49_152


def test_synthetic_prefix_sums_are_in_the_paper_regime():
    """All prompts resident take ~65% of the 18,939-token budget (the issue's three 8K
    prompts beside ~37K: 66%), leave about a third free, and so roughly halve the batch
    against keeping a single prompt."""
    budget = QWEN_A100_KV_TOKENS
    stage = STAGE_INPUT_TOKENS + STAGE_OUTPUT_TOKENS
    assert round(3 * 8192 / 37_000, 3) == 0.664  # the reference ratio
    for name in SYNTHETIC:
        inst = generate(name, num_tasks=2, seed=0)
        p = prefixes(inst)
        total = sum(p.values())
        assert total == 3 * CHAIN3_PREFIX_TOKENS == 4 * DAG4_PREFIX_TOKENS == 12_288
        assert round(total / budget, 3) == 0.649
        assert abs(total / budget - 3 * 8192 / 37_000) < 0.02
        # every stage fits beside its own prompt
        largest = max(p[s.agent] + s.input_tokens + s.output_tokens for s in inst.tasks[0].stages)
        assert largest == max(p.values()) + 768 <= budget
        # the room left with every prompt resident: about a third of the budget
        free_all = budget - total
        assert free_all == 6_651 and round(free_all / budget, 3) == 0.351
        # stages that fit: all prompts resident vs all but one drained
        all_resident = free_all // stage
        one_resident = (budget - max(p.values())) // stage
        assert all_resident == 8
        assert one_resident == (19 if name == "chain-3" else 20)
        assert 0.35 <= all_resident / one_resident <= 0.5


def test_synthetic_overrides():
    inst = generate("chain-3", num_tasks=5, seed=1, prefix_tokens=8192)
    assert set(prefixes(inst).values()) == {8192}  # the literal 8K: 130% of 18,939
    inst = generate("chain-3", num_tasks=5, seed=1, input_tokens=1000, output_tokens="128")
    assert {(s.input_tokens, s.output_tokens) for t in inst.tasks for s in t.stages} == {
        (1000, 128)
    }
    inst = generate("chain-3", num_tasks=2, seed=1, length=5, num_agents=2)
    assert [s.agent for s in inst.tasks[0].stages] == ["agent0", "agent1"] * 2 + ["agent0"]
    inst = generate("dag-4", num_tasks=2, seed=1, num_agents=2)
    assert [s.agent for s in inst.tasks[0].stages] == ["agent0", "agent1", "agent0", "agent1"]
    inst = generate("dag-10-wide", num_tasks=2, seed=1, width=4, num_agents=2)
    t = inst.tasks[0]
    assert len(t.stages) == 6 and len(inst.agents) == 2
    assert {s.agent for s in t.stages if s.id.startswith("w")} == {"agent1"}
    inst = generate("dag-10-wide", num_tasks=2, seed=1, num_agents=1)
    assert {s.agent for s in inst.tasks[0].stages} == {"agent0"}


@pytest.mark.parametrize(
    ("name", "params", "culprit"),
    [
        ("chain-3", {"bogus": 1}, "bogus"),
        ("chain-3", {"prefix_tokens": 0}, "prefix_tokens"),
        ("chain-3", {"prefix_tokens": "big"}, "prefix_tokens"),
        ("chain-3", {"input_tokens": 5000}, "input_tokens"),
        ("chain-3", {"output_tokens": 4096}, "output_tokens"),
        ("chain-3", {"length": 0}, "length"),
        ("dag-4", {"num_agents": 5}, "num_agents"),
        ("dag-10-wide", {"width": 0}, "width"),
        ("dag-10-wide", {"width": 2, "num_agents": 4}, "num_agents"),
        ("metagpt-sop-paper", {"prefix_scale": 0}, "prefix_scale"),
        ("metagpt-sop-paper", {"requirement_min_tokens": 300}, "requirement_min_tokens"),
        ("metagpt-sop-paper", {"token_sigma": -1}, "token_sigma"),
        ("metagpt-tl-paper", {"workers": "pm,boss"}, "workers"),
        ("metagpt-tl-paper", {"workers": ""}, "workers"),
    ],
)
def test_bad_parameter_is_named(name, params, culprit):
    with pytest.raises(ValueError, match=re.escape(culprit)):
        generate(name, num_tasks=2, seed=0, **params)


# --------------------------------------------------------------------------- MetaGPT


def test_metagpt_prompt_sizes_are_the_measured_constants():
    assert SOP_PROMPT_TOKENS == {
        "pm": 937,
        "architect": 720,
        "pjm": 504,
        "engineer": 399,
        "qa": 446,
    }
    assert TL_PROMPT_TOKENS == {
        "tl": 3615,
        "pm": 4908,
        "architect": 1979,
        "engineer": 9131,
        "data_analyst": 2753,
    }
    sop = generate("metagpt-sop-paper", num_tasks=20, seed=3)
    assert prefixes(sop) == SOP_PROMPT_TOKENS
    tl = generate("metagpt-tl-paper", num_tasks=20, seed=3)
    assert prefixes(tl) == TL_PROMPT_TOKENS
    # plausible: SOP role + action prompts of a few hundred to ~1K tokens; RoleZero prompts
    # with tool schemas and examples of ~2-10K
    assert all(300 <= v <= 1_500 for v in SOP_PROMPT_TOKENS.values())
    assert all(1_500 <= v <= 12_000 for v in TL_PROMPT_TOKENS.values())
    assert sum(SOP_PROMPT_TOKENS.values()) == 3_006
    assert sum(TL_PROMPT_TOKENS.values()) == 22_386
    # measured, not rescaled: 16% and 118% of the profile's 18,939-token budget
    budget = QWEN_A100_KV_TOKENS
    assert round(sum(SOP_PROMPT_TOKENS.values()) / budget, 2) == 0.16
    assert round(sum(TL_PROMPT_TOKENS.values()) / budget, 2) == 1.18
    # TL: the five prompts cannot all be resident (the scheduler must drain), yet every
    # single prompt with the largest stage it can draw fits
    assert sum(TL_PROMPT_TOKENS.values()) - budget == 3_447
    assert max(TL_PROMPT_TOKENS.values()) + 4096 + 2048 <= budget
    # prefix_scale multiplies them
    half = generate("metagpt-tl-paper", num_tasks=2, seed=3, prefix_scale=0.5)
    assert prefixes(half) == {k: round(v / 2) for k, v in TL_PROMPT_TOKENS.items()}


def test_metagpt_sop_paper_is_a_five_role_pipeline():
    inst = generate("metagpt-sop-paper", num_tasks=20, seed=3)
    for t in inst.tasks:
        assert [(s.id, s.agent, s.deps) for s in t.stages] == [
            ("prd", "pm", ()),
            ("design", "architect", ("prd",)),
            ("tasks", "pjm", ("design",)),
            ("code", "engineer", ("tasks",)),
            ("test", "qa", ("code",)),
        ]
        # the first stage's input is the SoftwareDev requirement
        assert REQUIREMENT_MIN_TOKENS <= t.stages[0].input_tokens <= REQUIREMENT_MAX_TOKENS
    short = generate("metagpt-sop-paper", num_tasks=2, seed=3, pjm=False, qa=False)
    assert [s.agent for s in short.tasks[0].stages] == ["pm", "architect", "engineer"]
    assert short.tasks[0].stages[2].deps == ("design",)
    assert set(prefixes(short)) == {"pm", "architect", "engineer"}


def test_metagpt_tl_paper_is_a_nine_stage_star():
    inst = generate("metagpt-tl-paper", num_tasks=20, seed=3)
    for t in inst.tasks:
        assert [s.id for s in t.stages] == [
            "tl_0",
            "pm_1",
            "tl_1",
            "architect_2",
            "tl_2",
            "data_analyst_3",
            "tl_3",
            "engineer_4",
            "tl_4",
        ]
        agents = [s.agent for s in t.stages]
        assert agents == [
            "tl",
            "pm",
            "tl",
            "architect",
            "tl",
            "data_analyst",
            "tl",
            "engineer",
            "tl",
        ]
        assert agents.count("tl") == 5
        # a chain (one assignment at a time) whose every edge touches the TeamLeader
        for prev, cur in zip(t.stages, t.stages[1:], strict=False):
            assert cur.deps == (prev.id,)
            assert "tl" in (prev.agent, cur.agent)
        first = t.stages[0]
        assert first.input_tokens >= REQUIREMENT_MIN_TOKENS
    two = generate("metagpt-tl-paper", num_tasks=2, seed=3, workers="engineer,engineer")
    assert [s.agent for s in two.tasks[0].stages] == ["tl", "engineer", "tl", "engineer", "tl"]
    assert set(prefixes(two)) == {"tl", "engineer"}


def test_metagpt_token_sigma_zero_fixes_every_call_but_the_requirement():
    inst = generate("metagpt-sop-paper", num_tasks=20, seed=3, token_sigma=0)
    rest = {tuple((s.input_tokens, s.output_tokens) for s in t.stages[1:]) for t in inst.tasks}
    assert len(rest) == 1
    assert len({t.stages[0].input_tokens for t in inst.tasks}) > 1  # requirements vary
    assert len({t.stages[0].output_tokens for t in inst.tasks}) == 1


def test_metagpt_defaults():
    sop = WORKLOADS["metagpt-sop-paper"].params
    assert sop["requirement_min_tokens"] == 40 and sop["requirement_max_tokens"] == 200
    assert sop["prefix_scale"] == 1.0 and sop["token_sigma"] == 0.5
    tl = WORKLOADS["metagpt-tl-paper"].params
    assert tl["workers"] == "pm,architect,data_analyst,engineer"
    for name in ("metagpt-sop-paper", "metagpt-tl-paper"):
        inst = generate(name, num_tasks=2, seed=0)
        assert inst.server.kv_capacity_tokens == QWEN_A100_KV_TOKENS


# --------------------------------------------------------------------------- small


@pytest.mark.parametrize("name", PAPER)
def test_small_instance_works_and_every_stage_fits(name):
    for seed in range(4):
        inst = small_instance(name, seed)
        again = small_instance(name, seed)
        assert inst.to_json() == again.to_json()
        assert isinstance(inst.server.cost_model, StepCost)
        assert len(inst.tasks) == 3
        assert 2 <= len(inst.agents) <= 4
        assert 9 <= inst.num_stages <= 15
        cap = inst.server.kv_capacity_tokens
        p = prefixes(inst)
        chunk = inst.server.chunk_tokens
        for t in inst.tasks:
            assert isinstance(t.arrival, int)
            for s in t.stages:
                assert p[s.agent] + s.input_tokens + s.output_tokens <= cap
                assert 1 <= math.ceil(s.input_tokens / chunk) + s.output_tokens <= 40
        assert sum(p.values()) < cap


# --------------------------------------------------------------------------- docs


def test_docs_have_the_paper_section_and_the_prompt_table():
    text = DOCS.read_text()
    assert "## The paper's workloads" in text
    section = text.split("## The paper's workloads", 1)[1]
    for name in PAPER:
        assert f"`{name}`" in section
    for table in (SOP_PROMPT_TOKENS, TL_PROMPT_TOKENS):
        for v in table.values():
            assert f"{v:,}" in section or str(v) in section
    assert "analysis/metagpt_prompt_tokens.py" in section
    paper = section.split("## Sources", 1)[0]
    for text_ in ("18,939", "12,288", "64.9%", "16%", "118%", "docs/profiles.md", "~37K"):
        assert text_ in paper, text_
    assert "PAPER_KV_TOKENS" not in paper
