"""Synthetic families: ``chain``, ``fanout`` and ``mixed``.

Their token numbers are *chosen* to span the regime of the multi-agent serving papers
(system prompts of 1K-8K tokens, calls of a few hundred to ~1.5K input tokens and 100-600
output tokens); they are not measured. See ``docs/workloads.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from topas.instance import Agent, Stage
from topas.workloads._common import (
    DEFAULT_TOKEN_SIGMA,
    INPUT_CAP,
    Draft,
    Workload,
    draw_input,
    draw_output,
    log_uniform,
    require,
    require_choice,
    uniform_int,
)

# Chosen, to span the regime of the papers (not measured): see docs/workloads.md.
PREFIX_MIN = 1024  # smallest agent system prompt (tokens)
PREFIX_MAX = 8192  # largest agent system prompt (tokens)
INPUT_MEAN_MIN = 300  # per-agent mean call input, drawn log-uniformly in [min, max]
INPUT_MEAN_MAX = 1500
OUTPUT_MEAN_MIN = 100  # per-agent mean call output, drawn log-uniformly in [min, max]
OUTPUT_MEAN_MAX = 600

_COMMON_PARAMS: dict[str, Any] = {
    "prefix_min": PREFIX_MIN,
    "prefix_max": PREFIX_MAX,
    "input_mean_min": INPUT_MEAN_MIN,
    "input_mean_max": INPUT_MEAN_MAX,
    "output_mean_min": OUTPUT_MEAN_MIN,
    "output_mean_max": OUTPUT_MEAN_MAX,
    "token_sigma": DEFAULT_TOKEN_SIGMA,
    "carry_outputs": True,
}

_COMMON_HELP: dict[str, str] = {
    "num_agents": "number of agents (agent0, agent1, ...)",
    "prefix_min": "smallest agent prefix (system prompt) in tokens, drawn uniformly per agent",
    "prefix_max": "largest agent prefix in tokens",
    "input_mean_min": "per-agent mean input tokens is log-uniform in [input_mean_min, ..._max]",
    "input_mean_max": "see input_mean_min",
    "output_mean_min": "per-agent mean output tokens is log-uniform in [output_mean_min, ..._max]",
    "output_mean_max": "see output_mean_min",
    "token_sigma": "lognormal sigma of each call's input and output around its agent's mean",
    "carry_outputs": "a stage's input also contains its dependencies' outputs (capped)",
}


@dataclass(frozen=True)
class _Profile:
    agent: Agent
    input_mean: float
    output_mean: float


def _check_common(p: Mapping[str, Any]) -> None:
    require(p["num_agents"] >= 1, f"parameter num_agents: must be >= 1, got {p['num_agents']}")
    require(
        1 <= p["prefix_min"] <= p["prefix_max"],
        "parameters prefix_min/prefix_max: need 1 <= prefix_min <= prefix_max",
    )
    for k in ("input", "output"):
        lo, hi = p[f"{k}_mean_min"], p[f"{k}_mean_max"]
        require(0 < lo <= hi, f"parameters {k}_mean_min/{k}_mean_max: need 0 < min <= max")
    require(p["token_sigma"] >= 0, "parameter token_sigma: must be >= 0")


def _check_range(p: Mapping[str, Any], lo: str, hi: str, least: int = 1) -> None:
    require(
        least <= p[lo] <= p[hi],
        f"parameters {lo}/{hi}: need {least} <= {lo} <= {hi}, got {p[lo]} and {p[hi]}",
    )


def _check_prob(p: Mapping[str, Any], name: str) -> None:
    require(0.0 <= p[name] <= 1.0, f"parameter {name}: must be in [0, 1], got {p[name]}")


def _agents(rng: np.random.Generator, p: Mapping[str, Any]) -> list[_Profile]:
    """Agents ``agent0..``: prefix, mean input and mean output drawn once per instance."""
    out = []
    for i in range(p["num_agents"]):
        prefix = uniform_int(rng, p["prefix_min"], p["prefix_max"])
        in_mean = log_uniform(rng, p["input_mean_min"], p["input_mean_max"])
        out_mean = log_uniform(rng, p["output_mean_min"], p["output_mean_max"])
        out.append(_Profile(Agent(f"agent{i}", prefix), in_mean, out_mean))
    return out


class _TaskBuilder:
    """Adds stages to one task, drawing tokens from the calling agent's profile."""

    def __init__(self, rng: np.random.Generator, p: Mapping[str, Any]) -> None:
        self.rng = rng
        self.sigma = p["token_sigma"]
        self.carry = p["carry_outputs"]
        self.stages: list[Stage] = []
        self.outputs: dict[str, int] = {}

    def add(self, sid: str, prof: _Profile, deps: Sequence[str] = ()) -> str:
        inp = draw_input(self.rng, prof.input_mean, self.sigma)
        if self.carry:
            inp = min(INPUT_CAP, inp + sum(self.outputs[d] for d in deps))
        out = draw_output(self.rng, prof.output_mean, self.sigma)
        self.stages.append(Stage(sid, prof.agent.id, inp, out, tuple(deps)))
        self.outputs[sid] = out
        return sid


# --------------------------------------------------------------------------- chain


def build_chain(rng: np.random.Generator, num_tasks: int, p: Mapping[str, Any]) -> Draft:
    """Each task is a path s0 -> s1 -> ... of k stages, k uniform in [min_stages, max_stages]."""
    _check_common(p)
    _check_range(p, "min_stages", "max_stages")
    require_choice(p["agent_order"], "agent_order", ("cyclic", "random"))
    profiles = _agents(rng, p)
    n = len(profiles)
    tasks = []
    for _ in range(num_tasks):
        tb = _TaskBuilder(rng, p)
        k = uniform_int(rng, p["min_stages"], p["max_stages"])
        prev: tuple[str, ...] = ()
        for i in range(k):
            a = i % n if p["agent_order"] == "cyclic" else int(rng.integers(n))
            prev = (tb.add(f"s{i}", profiles[a], prev),)
        tasks.append(tuple(tb.stages))
    return Draft(tuple(pr.agent for pr in profiles), tuple(tasks))


CHAIN = Workload(
    name="chain",
    description=(
        "Sequential agent pipeline: each task is a path of k stages (k uniform in "
        "[min_stages, max_stages]); stage i calls agent i mod num_agents (agent_order=cyclic) "
        "or a uniformly random agent (agent_order=random) and depends on stage i-1. "
        "Agent prefixes are 1K-8K tokens, drawn once per instance."
    ),
    params={"num_agents": 4, "min_stages": 3, "max_stages": 8, "agent_order": "cyclic"}
    | _COMMON_PARAMS,
    param_help=_COMMON_HELP
    | {
        "min_stages": "fewest stages per task",
        "max_stages": "most stages per task",
        "agent_order": "cyclic (stage i calls agent i mod num_agents) or random",
    },
    build=build_chain,
    small_params={"num_agents": 3, "min_stages": 3, "max_stages": 5, "token_sigma": 0.25},
)


# --------------------------------------------------------------------------- fanout


def build_fanout(rng: np.random.Generator, num_tasks: int, p: Mapping[str, Any]) -> Draft:
    """plan -> map1..mapm -> reduce (levels=1), or with a split/merge level in between."""
    _check_common(p)
    _check_range(p, "min_mappers", "max_mappers")
    _check_range(p, "min_groups", "max_groups")
    require_choice(p["mapper_agents"], "mapper_agents", ("same", "different"))
    require_choice(p["levels"], "levels", (1, 2))
    profiles = _agents(rng, p)
    hub = profiles[0]
    workers = profiles[1:] or profiles
    tasks = []
    for _ in range(num_tasks):
        tb = _TaskBuilder(rng, p)
        same = workers[int(rng.integers(len(workers)))]

        def mapper(_same: _Profile = same) -> _Profile:
            if p["mapper_agents"] == "same":
                return _same
            return workers[int(rng.integers(len(workers)))]

        plan = tb.add("plan", hub)
        if p["levels"] == 1:
            m = uniform_int(rng, p["min_mappers"], p["max_mappers"])
            maps = [tb.add(f"map{i}", mapper(), (plan,)) for i in range(1, m + 1)]
            tb.add("reduce", hub, maps)
        else:
            g = uniform_int(rng, p["min_groups"], p["max_groups"])
            merges = []
            for i in range(1, g + 1):
                split = tb.add(f"split{i}", hub, (plan,))
                m = uniform_int(rng, p["min_mappers"], p["max_mappers"])
                maps = [tb.add(f"map{i}_{j}", mapper(), (split,)) for j in range(1, m + 1)]
                merges.append(tb.add(f"merge{i}", hub, maps))
            tb.add("reduce", hub, merges)
        tasks.append(tuple(tb.stages))
    return Draft(tuple(pr.agent for pr in profiles), tuple(tasks))


FANOUT = Workload(
    name="fanout",
    description=(
        "Fan-out/fan-in map-reduce: a planner stage (agent0), m parallel mapper stages "
        "(m uniform in [min_mappers, max_mappers]) on worker agents (agent1, ...; one worker "
        "per task with mapper_agents=same, one per mapper with =different), and a reducer "
        "(agent0) depending on all mappers. levels=2 inserts split/merge stages: plan -> "
        "split_i -> map_i_j -> merge_i -> reduce, with g groups uniform in [min_groups, "
        "max_groups]."
    ),
    params={
        "num_agents": 4,
        "min_mappers": 2,
        "max_mappers": 6,
        "mapper_agents": "same",
        "levels": 1,
        "min_groups": 2,
        "max_groups": 3,
    }
    | _COMMON_PARAMS,
    param_help=_COMMON_HELP
    | {
        "num_agents": "number of agents: agent0 plans and reduces, the others map",
        "min_mappers": "fewest mappers (per group when levels=2)",
        "max_mappers": "most mappers (per group when levels=2)",
        "mapper_agents": "same (one worker agent per task) or different (one per mapper)",
        "levels": "1 (plan/map/reduce) or 2 (plan/split/map/merge/reduce)",
        "min_groups": "fewest split/merge groups when levels=2",
        "max_groups": "most split/merge groups when levels=2",
    },
    build=build_fanout,
    small_params={"num_agents": 3, "min_mappers": 1, "max_mappers": 3, "token_sigma": 0.25},
)


# --------------------------------------------------------------------------- mixed


def build_mixed(rng: np.random.Generator, num_tasks: int, p: Mapping[str, Any]) -> Draft:
    """Random layered DAGs: each non-root stage depends on >= 1 stage of the layer above,
    and each stage outside the last layer has >= 1 child in the layer below."""
    _check_common(p)
    _check_range(p, "min_layers", "max_layers")
    _check_range(p, "min_width", "max_width")
    _check_prob(p, "edge_prob")
    _check_prob(p, "skip_prob")
    cap = p["max_stages"]
    require(
        cap is None or cap >= p["max_layers"],
        "parameter max_stages: must be None or >= max_layers",
    )
    profiles = _agents(rng, p)
    n = len(profiles)
    tasks = []
    for _ in range(num_tasks):
        tb = _TaskBuilder(rng, p)
        num_layers = uniform_int(rng, p["min_layers"], p["max_layers"])
        widths = [uniform_int(rng, p["min_width"], p["max_width"]) for _ in range(num_layers)]
        while cap is not None and sum(widths) > cap:
            wide = [i for i, w in enumerate(widths) if w > 1]
            widths[wide[int(rng.integers(len(wide)))]] -= 1
        # structure first: ids by layer, deps, then one child for every non-final stage
        layers: list[list[int]] = []
        deps: list[list[int]] = []
        for w in widths:
            layer = []
            for _ in range(w):
                d: list[int] = []
                if layers:
                    above = layers[-1]
                    d = [v for v in above if rng.random() < p["edge_prob"]]
                    if not d:
                        d = [above[int(rng.integers(len(above)))]]
                    for earlier in layers[:-1]:
                        d += [v for v in earlier if rng.random() < p["skip_prob"]]
                layer.append(len(deps))
                deps.append(d)
            layers.append(layer)
        for upper, lower in zip(layers, layers[1:], strict=False):
            for v in upper:
                if not any(v in deps[u] for u in lower):
                    deps[lower[int(rng.integers(len(lower)))]].append(v)
        for v, d in enumerate(deps):
            agent = profiles[int(rng.integers(n))]
            tb.add(f"s{v}", agent, [f"s{u}" for u in sorted(d)])
        tasks.append(tuple(tb.stages))
    return Draft(tuple(pr.agent for pr in profiles), tuple(tasks))


MIXED = Workload(
    name="mixed",
    description=(
        "Random layered DAGs: L layers (uniform in [min_layers, max_layers]) of random width "
        "(uniform in [min_width, max_width]); each stage of a layer depends on each stage of "
        "the layer above with probability edge_prob (at least one), and on each stage of "
        "earlier layers with probability skip_prob; every stage outside the last layer feeds "
        "at least one stage of the next layer; every stage calls a uniformly random agent."
    ),
    params={
        "num_agents": 6,
        "min_layers": 2,
        "max_layers": 5,
        "min_width": 1,
        "max_width": 4,
        "edge_prob": 0.5,
        "skip_prob": 0.1,
        "max_stages": None,
    }
    | _COMMON_PARAMS,
    param_help=_COMMON_HELP
    | {
        "min_layers": "fewest layers per task",
        "max_layers": "most layers per task",
        "min_width": "fewest stages per layer",
        "max_width": "most stages per layer",
        "edge_prob": "probability of an edge from each stage of the layer above",
        "skip_prob": "probability of an edge from each stage of earlier layers",
        "max_stages": "cap on stages per task (layers are narrowed at random); None: no cap",
    },
    build=build_mixed,
    small_params={
        "num_agents": 3,
        "min_layers": 3,
        "max_layers": 3,
        "min_width": 1,
        "max_width": 2,
        "max_stages": 5,
        "token_sigma": 0.25,
    },
)
