"""MetaGPT families: ``metagpt-sop`` (the SOP software company) and ``metagpt-tl``
(the TeamLeader hub of MetaGPT's MGX mode).

Sources of every number are in the comments and in ``docs/workloads.md``:
Hong et al., "MetaGPT: Meta Programming for a Multi-Agent Collaborative Framework",
ICLR 2024 (per-project token totals and file counts, GPT-4), and MetaGPT's source
(``geekan/MetaGPT``: roles/engineer.py, actions/write_code_review.py, config2.py,
roles/qa_engineer.py, roles/di/team_leader.py) for the shape of the workflows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from topas.instance import Agent, Stage
from topas.workloads._common import (
    DEFAULT_TOKEN_SIGMA,
    Draft,
    Workload,
    draw_input,
    draw_output,
    positive_poisson,
    require,
    uniform_int,
)

# --------------------------------------------------------------------------- paper targets

# Hong et al. (ICLR 2024), SoftwareDev statistics of MetaGPT with GPT-4, per project:
PAPER_PROMPT_TOKENS = 26_600  # ~26.6K prompt tokens per software project
PAPER_COMPLETION_TOKENS = 6_200  # ~6.2K completion tokens per software project
PAPER_CODE_FILES = 4.7  # ~4.7 code files per project

# --------------------------------------------------------------------------- metagpt-sop

# Role prompts (system prompt + the role's fixed action instructions), ~1-2K tokens each
# (brief; MetaGPT's ActionNode instructions and format examples): uniform per agent.
SOP_PREFIX_MIN = 1000
SOP_PREFIX_MAX = 2000

# MetaGPT source: WriteCodeReview runs up to `code_validate_k_times` review rounds
# (config2.py default 2), each "LBTM" verdict triggers a rewrite call; `--code-review`
# defaults to True (software_company.py).
SOP_REVIEW_ROUNDS = 2
SOP_REWRITE_PROB = 0.2  # chosen: P(a review asks for a rewrite, "LBTM")
# MetaGPT source: QaEngineer.test_round_allowed = 5 (roles/qa_engineer.py).
SOP_MAX_FIX_LOOPS = 5
SOP_FIX_PROB = 0.35  # chosen: P(a QA round finds a bug that the Engineer must fix)

# Per-call mean (input, output) tokens. Chosen so that the expected totals per project
# match the paper: completion ~6.2K, and prompt (role prompt + input, per call) ~26.6K up
# to the ~25K that 1-2K role prompts on ~16.5 calls already take (see docs/workloads.md).
# Inputs are the variable part of the prompt (the upstream document or code excerpt).
SOP_TOKENS: dict[str, tuple[float, float]] = {
    "prd": (120, 650),  # requirement -> PRD
    "design": (600, 850),  # PRD -> system design
    "tasks": (700, 450),  # design -> task list (ProjectManager)
    "code": (450, 480),  # design/task excerpt -> one code file
    "review": (450, 120),  # code -> review verdict and comments
    "rewrite": (450, 480),  # code + comments -> rewritten file
    "qa": (450, 400),  # code -> tests and test verdict
    "fix": (350, 350),  # bug report -> fix
}


def _sop_agents(rng: np.random.Generator, p: Mapping[str, Any]) -> tuple[Agent, ...]:
    roles = ["pm", "architect"] + (["pjm"] if p["pjm"] else []) + ["engineer"]
    roles += ["qa"] if p["qa"] else []
    return tuple(Agent(r, uniform_int(rng, p["prefix_min"], p["prefix_max"])) for r in roles)


def _check_sop(p: Mapping[str, Any]) -> None:
    require(p["mean_files"] >= 1, "parameter mean_files: must be >= 1")
    require(p["max_files"] >= 1, "parameter max_files: must be >= 1")
    require(p["review_rounds"] >= 0, "parameter review_rounds: must be >= 0")
    require(p["max_fix_loops"] >= 0, "parameter max_fix_loops: must be >= 0")
    for k in ("rewrite_prob", "fix_prob"):
        require(0.0 <= p[k] <= 1.0, f"parameter {k}: must be in [0, 1], got {p[k]}")
    require(
        1 <= p["prefix_min"] <= p["prefix_max"],
        "parameters prefix_min/prefix_max: need 1 <= prefix_min <= prefix_max",
    )
    require(p["token_sigma"] >= 0, "parameter token_sigma: must be >= 0")


@dataclass
class _Calls:
    """Adds stages to one task with tokens drawn from a table of per-kind means."""

    rng: np.random.Generator
    sigma: float
    table: Mapping[str, tuple[float, float]]

    def __post_init__(self) -> None:
        self.stages: list[Stage] = []

    def add(
        self, sid: str, agent: str, kind: str, deps: tuple[str, ...] = (), extra_in: float = 0.0
    ) -> str:
        in_mean, out_mean = self.table[kind]
        inp = draw_input(self.rng, in_mean + extra_in, self.sigma)
        out = draw_output(self.rng, out_mean, self.sigma)
        self.stages.append(Stage(sid, agent, inp, out, deps))
        return sid


def build_sop(rng: np.random.Generator, num_tasks: int, p: Mapping[str, Any]) -> Draft:
    """PRD -> design -> tasks -> per-file code + review rounds -> QA/fix loops."""
    _check_sop(p)
    agents = _sop_agents(rng, p)
    tasks = []
    for _ in range(num_tasks):
        c = _Calls(rng, p["token_sigma"], SOP_TOKENS)
        last = c.add("prd", "pm", "prd")
        last = c.add("design", "architect", "design", (last,))
        if p["pjm"]:
            last = c.add("tasks", "pjm", "tasks", (last,))
        upstream = last
        ends = []
        for f in range(1, positive_poisson(rng, p["mean_files"], p["max_files"]) + 1):
            start = last if not p["parallel_files"] else upstream
            cur = c.add(f"code_f{f}", "engineer", "code", (start,))
            for r in range(1, p["review_rounds"] + 1):
                cur = c.add(f"review_f{f}_r{r}", "engineer", "review", (cur,))
                if rng.random() >= p["rewrite_prob"]:
                    break
                cur = c.add(f"rewrite_f{f}_r{r}", "engineer", "rewrite", (cur,))
            ends.append(cur)
            last = cur
        if p["qa"]:
            cur = c.add("qa_1", "qa", "qa", tuple(ends) if p["parallel_files"] else (last,))
            for k in range(1, p["max_fix_loops"] + 1):
                if rng.random() >= p["fix_prob"]:
                    break
                cur = c.add(f"fix_{k}", "engineer", "fix", (cur,))
                cur = c.add(f"qa_{k + 1}", "qa", "qa", (cur,))
        tasks.append(tuple(c.stages))
    return Draft(agents, tuple(tasks))


def expected_sop_tokens(p: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Expected per-project stage count and token totals of ``metagpt-sop`` (no clipping).

    ``prompt`` counts, for every call, its agent's prefix plus its input tokens (what an
    API bills as prompt tokens); ``completion`` sums output tokens.
    """
    q = dict(METAGPT_SOP.params) | dict(p or {})
    files = q["mean_files"]  # 1 + Poisson(mean - 1); the cap at max_files is ignored
    w = q["rewrite_prob"]
    reviews = sum(w**r for r in range(q["review_rounds"]))  # review r happens w.p. w^(r-1)
    rewrites = sum(w**r for r in range(1, q["review_rounds"] + 1))
    loops = sum(q["fix_prob"] ** k for k in range(1, q["max_fix_loops"] + 1)) if q["qa"] else 0
    counts = {
        "prd": 1.0,
        "design": 1.0,
        "tasks": 1.0 if q["pjm"] else 0.0,
        "code": files,
        "review": files * reviews,
        "rewrite": files * rewrites,
        "qa": (1.0 + loops) if q["qa"] else 0.0,
        "fix": loops,
    }
    prefix = (q["prefix_min"] + q["prefix_max"]) / 2
    stages = sum(counts.values())
    inputs = sum(n * SOP_TOKENS[k][0] for k, n in counts.items())
    outputs = sum(n * SOP_TOKENS[k][1] for k, n in counts.items())
    return {
        "stages": stages,
        "prompt": stages * prefix + inputs,
        "input": inputs,
        "completion": outputs,
    }


METAGPT_SOP = Workload(
    name="metagpt-sop",
    description=(
        "MetaGPT's SOP software company, one project per task: ProductManager writes the PRD, "
        "Architect the design, ProjectManager the task list; the Engineer codes each file "
        "(1 + Poisson(mean_files - 1) files, ~4.7 on average as in the MetaGPT paper), each "
        "followed by up to review_rounds code reviews, each of which asks for a rewrite with "
        "probability rewrite_prob (MetaGPT's WriteCodeReview); then the QA Engineer tests, "
        "with fix loops (Engineer fix, QA again) while a bug is found (probability fix_prob, at "
        "most max_fix_loops). Files are written one after another as MetaGPT's Engineer does, "
        "or in parallel with parallel_files=true. Calibrated to ~6.2K completion tokens per "
        "project."
    ),
    params={
        "mean_files": PAPER_CODE_FILES,
        "max_files": 16,
        "parallel_files": False,
        "review_rounds": SOP_REVIEW_ROUNDS,
        "rewrite_prob": SOP_REWRITE_PROB,
        "qa": True,
        "fix_prob": SOP_FIX_PROB,
        "max_fix_loops": SOP_MAX_FIX_LOOPS,
        "pjm": True,
        "prefix_min": SOP_PREFIX_MIN,
        "prefix_max": SOP_PREFIX_MAX,
        "token_sigma": DEFAULT_TOKEN_SIGMA,
    },
    param_help={
        "mean_files": "mean code files per project (1 + Poisson(mean_files - 1))",
        "max_files": "cap on code files per project",
        "parallel_files": "files coded in parallel after the task list (default: in sequence)",
        "review_rounds": "most code-review rounds per file (0: no review)",
        "rewrite_prob": "probability that a review asks for a rewrite",
        "qa": "include the QA Engineer and its fix loops",
        "fix_prob": "probability that a QA round finds a bug (then fix and QA again)",
        "max_fix_loops": "most fix loops per project",
        "pjm": "include the ProjectManager's task-list stage",
        "prefix_min": "smallest role prompt (tokens), uniform per agent",
        "prefix_max": "largest role prompt (tokens)",
        "token_sigma": "lognormal sigma of each call's input and output around its mean",
    },
    build=build_sop,
    small_params={
        "mean_files": 1.5,
        "max_files": 2,
        "parallel_files": True,
        "review_rounds": 0,
        "max_fix_loops": 0,
        "pjm": False,
        "token_sigma": 0.25,
    },
)

# --------------------------------------------------------------------------- metagpt-tl

# Brief: TL-mode prompts carry role, tool schemas and examples: several thousand tokens,
# 6-8K for the TeamLeader, 2-4K for the workers. Uniform per agent.
TL_PREFIX_MIN = 6000
TL_PREFIX_MAX = 8000
WORKER_PREFIX_MIN = 2000
WORKER_PREFIX_MAX = 4000

TL_DATA_ANALYST_PROB = 0.3  # chosen: share of tasks that are data-analysis tasks
TL_MEAN_ENGINEER_DISPATCHES = 2.0  # chosen: engineer assignments per software task
TL_MAX_ENGINEER_DISPATCHES = 4
TL_MEAN_ANALYST_DISPATCHES = 3.0  # chosen: data-analyst assignments per analysis task
TL_MAX_ANALYST_DISPATCHES = 5

# Per-call mean (input, output) tokens: chosen (not measured). The TeamLeader's input is its
# memory of the conversation, which grows by TL_HISTORY_GROWTH per dispatch; its outputs are
# short commands (plan, publish_team_message); workers produce documents, code or cells.
TL_HISTORY_GROWTH = 300
TL_TOKENS: dict[str, tuple[float, float]] = {
    "tl_plan": (400, 350),
    "tl_review": (500, 200),
    "pm": (600, 700),
    "architect": (900, 900),
    "engineer": (1200, 800),
    "data_analyst": (900, 500),
}


def _check_tl(p: Mapping[str, Any]) -> None:
    for k in ("data_analyst_prob",):
        require(0.0 <= p[k] <= 1.0, f"parameter {k}: must be in [0, 1], got {p[k]}")
    for k in ("engineer", "analyst"):
        require(p[f"mean_{k}_dispatches"] >= 1, f"parameter mean_{k}_dispatches: must be >= 1")
        require(p[f"max_{k}_dispatches"] >= 1, f"parameter max_{k}_dispatches: must be >= 1")
    for k in ("tl", "worker"):
        require(
            1 <= p[f"{k}_prefix_min"] <= p[f"{k}_prefix_max"],
            f"parameters {k}_prefix_min/{k}_prefix_max: need 1 <= min <= max",
        )
    require(p["token_sigma"] >= 0, "parameter token_sigma: must be >= 0")


def build_tl(rng: np.random.Generator, num_tasks: int, p: Mapping[str, Any]) -> Draft:
    """tl_plan -> worker_1 -> tl_review_1 -> worker_2 -> tl_review_2 -> ... (a chain).

    MetaGPT's TeamLeader publishes one message to one team member and pauses until the
    reply (``publish_team_message`` sets its state to -1, roles/di/team_leader.py), so the
    calls alternate: each worker stage is followed by the TeamLeader's review of it, and
    the next dispatch depends on that review.
    """
    _check_tl(p)
    workers = ["pm"] + (["architect"] if p["architect"] else []) + ["engineer"]
    if p["data_analyst_prob"] > 0:
        workers.append("data_analyst")
    agents = [Agent("tl", uniform_int(rng, p["tl_prefix_min"], p["tl_prefix_max"]))]
    agents += [
        Agent(w, uniform_int(rng, p["worker_prefix_min"], p["worker_prefix_max"])) for w in workers
    ]
    tasks = []
    for _ in range(num_tasks):
        c = _Calls(rng, p["token_sigma"], TL_TOKENS)
        if rng.random() < p["data_analyst_prob"]:
            n = positive_poisson(rng, p["mean_analyst_dispatches"], p["max_analyst_dispatches"])
            plan = ["data_analyst"] * n
        else:
            plan = ["pm"] + (["architect"] if p["architect"] else [])
            plan += ["engineer"] * positive_poisson(
                rng, p["mean_engineer_dispatches"], p["max_engineer_dispatches"]
            )
        last = c.add("tl_plan", "tl", "tl_plan")
        for i, role in enumerate(plan, start=1):
            worker = c.add(f"{role}_{i}", role, role, (last,))
            last = c.add(
                f"tl_review_{i}",
                "tl",
                "tl_review",
                (worker,),
                extra_in=TL_HISTORY_GROWTH * (i - 1),
            )
        tasks.append(tuple(c.stages))
    return Draft(tuple(agents), tuple(tasks))


METAGPT_TL = Workload(
    name="metagpt-tl",
    description=(
        "MetaGPT's TeamLeader (MGX) mode: a TeamLeader hub with a long system prompt (role, "
        "tool schemas, examples: 6-8K tokens) plans, then dispatches one assignment at a time "
        "to ProductManager, Architect, Engineer or DataAnalyst (2-4K-token prompts) and "
        "reviews each result before the next dispatch, so TeamLeader calls interleave with "
        "worker calls: tl_plan -> pm_1 -> tl_review_1 -> architect_2 -> tl_review_2 -> "
        "engineer_3 -> ... A task is a software task (pm, architect, 1 + Poisson engineer "
        "assignments) or, with probability data_analyst_prob, a data-analysis task (1 + "
        "Poisson data_analyst assignments). The TeamLeader's input grows with its history."
    ),
    params={
        "data_analyst_prob": TL_DATA_ANALYST_PROB,
        "architect": True,
        "mean_engineer_dispatches": TL_MEAN_ENGINEER_DISPATCHES,
        "max_engineer_dispatches": TL_MAX_ENGINEER_DISPATCHES,
        "mean_analyst_dispatches": TL_MEAN_ANALYST_DISPATCHES,
        "max_analyst_dispatches": TL_MAX_ANALYST_DISPATCHES,
        "tl_prefix_min": TL_PREFIX_MIN,
        "tl_prefix_max": TL_PREFIX_MAX,
        "worker_prefix_min": WORKER_PREFIX_MIN,
        "worker_prefix_max": WORKER_PREFIX_MAX,
        "token_sigma": DEFAULT_TOKEN_SIGMA,
    },
    param_help={
        "data_analyst_prob": "probability that a task is a data-analysis task (0: no analyst)",
        "architect": "software tasks include an Architect assignment",
        "mean_engineer_dispatches": "mean Engineer assignments per software task",
        "max_engineer_dispatches": "cap on Engineer assignments",
        "mean_analyst_dispatches": "mean DataAnalyst assignments per analysis task",
        "max_analyst_dispatches": "cap on DataAnalyst assignments",
        "tl_prefix_min": "smallest TeamLeader prompt (tokens)",
        "tl_prefix_max": "largest TeamLeader prompt (tokens)",
        "worker_prefix_min": "smallest worker prompt (tokens), uniform per worker",
        "worker_prefix_max": "largest worker prompt (tokens)",
        "token_sigma": "lognormal sigma of each call's input and output around its mean",
    },
    build=build_tl,
    small_params={
        "architect": False,
        "max_engineer_dispatches": 1,
        "max_analyst_dispatches": 2,
        "token_sigma": 0.25,
    },
)
