"""Workload generators: ``chain``, ``fanout``, ``mixed``, ``metagpt-sop``, ``metagpt-tl``.

``generate(name, ...)`` draws a whole :class:`~topas.instance.Instance` (agents, task
DAGs, Poisson arrivals, server) from one seed; the same arguments always give the same
instance. ``small_instance(name, seed)`` draws a scaled-down step-timing instance for the
exact oracle. ``describe(name)`` explains a family and its parameters. Every number and
its source is in ``docs/workloads.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from topas.errors import InputError
from topas.instance import Agent, Instance, ServerSpec, Stage, StepCost, Task
from topas.params import coerce
from topas.profiles import DEFAULT_PROFILE, ServerProfile, get_profile
from topas.workloads._common import (
    DEFAULT_PREFIX_SHARE,
    DecodeRegime,
    Draft,
    ServerDefaults,
    Workload,
    decode_regime,
    default_server,
    mean_task_demand_s,
    task_demand_s,
)
from topas.workloads.arrivals import DEFAULT_LOAD, poisson_arrivals, rate_for_load
from topas.workloads.metagpt import METAGPT_SOP, METAGPT_TL, expected_sop_tokens
from topas.workloads.paper import PAPER_WORKLOADS
from topas.workloads.synthetic import CHAIN, FANOUT, MIXED

__all__ = [
    "DEFAULT_LOAD",
    "SMALL_ARRIVAL_SPAN_STEPS",
    "SMALL_FREE_STAGES",
    "SMALL_TOKEN_SCALE",
    "WORKLOADS",
    "DecodeRegime",
    "Draft",
    "ServerDefaults",
    "Workload",
    "decode_regime",
    "default_server",
    "describe",
    "expected_sop_tokens",
    "generate",
    "get_workload",
    "mean_task_demand_s",
    "resolve_params",
    "small_instance",
    "task_demand_s",
]

WORKLOADS: dict[str, Workload] = {
    w.name: w for w in (CHAIN, FANOUT, MIXED, METAGPT_SOP, METAGPT_TL, *PAPER_WORKLOADS)
}

COMMON_PARAMS: dict[str, Any] = {"prefix_share": DEFAULT_PREFIX_SHARE}
"""Parameters every family accepts, on top of its own."""

COMMON_HELP = {
    "prefix_share": "default KV budget = sum of agent prefixes / prefix_share (rounded up)",
}

TIMINGS = ("calibrated", "step")

SMALL_TOKEN_SCALE = 64.0
"""Token counts of small instances are divided by this: outputs of ~100-900 tokens become
stages of a few to ~15 steps, and prefixes of 1-8K tokens loads of 1-4 steps."""

SMALL_FREE_STAGES = 2.0
"""Small instances: the KV budget holds every prefix plus about this many average stages."""

SMALL_ARRIVAL_SPAN_STEPS = 15
"""Small instances default to a Poisson rate of (num_tasks - 1) / 15 tasks per step, so
that arrivals spread over roughly 0..20 steps."""


# --------------------------------------------------------------------------- lookup


def get_workload(name: str) -> Workload:
    """The family called ``name``; ValueError naming the valid ones otherwise."""
    try:
        return WORKLOADS[name]
    except (KeyError, TypeError):
        raise InputError(f"unknown workload {name!r} (valid: {', '.join(WORKLOADS)})") from None


def _coerce(name: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default`` (:func:`topas.params.coerce`; strings are
    accepted, as from a CLI; a default of None takes an integer or None)."""
    if isinstance(default, bool | float | str):
        kind: type = type(default)
    elif default is None or isinstance(default, int):
        kind = int
    else:
        return value
    try:
        return coerce(value, kind, optional=default is None)
    except ValueError:
        raise InputError(
            f"parameter {name}: invalid value {value!r} (default {default!r})"
        ) from None


def resolve_params(name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Defaults of family ``name`` (plus the common ones) overridden by ``params``.

    Unknown parameters raise ValueError listing the valid ones; values are converted to
    the default's type (so ``"3"`` works for an integer parameter).
    """
    wl = get_workload(name)
    defaults = dict(wl.params) | COMMON_PARAMS
    out = dict(defaults)
    for k, v in (params or {}).items():
        if k not in defaults:
            raise InputError(
                f"unknown parameter {k!r} for workload {name!r} "
                f"(valid: {', '.join(sorted(defaults))})"
            )
        out[k] = _coerce(k, v, defaults[k])
    share = out["prefix_share"]
    if not 0 < share <= 1:
        raise InputError(f"parameter prefix_share: must be in (0, 1], got {share}")
    return out


def describe(name: str) -> str:
    """One paragraph on family ``name`` and its parameters with their defaults (CLI help)."""
    wl = get_workload(name)
    helps = dict(wl.param_help) | COMMON_HELP
    defaults = dict(wl.params) | COMMON_PARAMS
    lines = [f"{wl.name}: {wl.description}", "", "Parameters (name = default: meaning):"]
    for k, v in defaults.items():
        lines.append(f"  {k} = {v!r}: {helps.get(k, '')}".rstrip(": "))
    return "\n".join(lines)


# --------------------------------------------------------------------------- scaling


def _scaled(x: int, s: float) -> int:
    return max(1, math.ceil(x / s - 1e-9))


def _scale(
    agents: tuple[Agent, ...],
    tasks: tuple[tuple[Stage, ...], ...],
    server: ServerSpec,
    s: float,
) -> tuple[tuple[Agent, ...], tuple[tuple[Stage, ...], ...], ServerSpec]:
    """Divide every token count by ``s`` (rounding up, at least 1), the server's too.

    If every stage fitted the KV budget before scaling, the scaled budget is raised where
    rounding up would otherwise make a stage not fit.
    """
    if s == 1.0:
        return agents, tasks, server
    prefix = {a.id: a.prefix_tokens for a in agents}
    fitted = all(
        prefix[st.agent] + st.input_tokens + st.output_tokens <= server.kv_capacity_tokens
        for t in tasks
        for st in t
    )
    new_agents = tuple(replace(a, prefix_tokens=_scaled(a.prefix_tokens, s)) for a in agents)
    new_prefix = {a.id: a.prefix_tokens for a in new_agents}
    new_tasks = tuple(
        tuple(
            replace(
                st,
                input_tokens=_scaled(st.input_tokens, s),
                output_tokens=_scaled(st.output_tokens, s),
                predicted_output_tokens=None,
            )
            for st in t
        )
        for t in tasks
    )
    kv = _scaled(server.kv_capacity_tokens, s)
    if fitted:
        need = max(
            new_prefix[st.agent] + st.input_tokens + st.output_tokens for t in new_tasks for st in t
        )
        kv = max(kv, need)
    new_server = replace(
        server, kv_capacity_tokens=kv, chunk_tokens=_scaled(server.chunk_tokens, s)
    )
    return new_agents, new_tasks, new_server


def _tight_kv(
    agents: tuple[Agent, ...], tasks: tuple[tuple[Stage, ...], ...], free_stages: float
) -> int:
    """Room for every prefix plus ``free_stages`` average stages (input + output), and at
    least the largest stage with its prefix."""
    prefix = {a.id: a.prefix_tokens for a in agents}
    stages = [st for t in tasks for st in t]
    mean_kv = sum(st.input_tokens + st.output_tokens for st in stages) / len(stages)
    need = max(prefix[st.agent] + st.input_tokens + st.output_tokens for st in stages)
    return max(need, sum(prefix.values()) + math.ceil(free_stages * mean_kv))


# --------------------------------------------------------------------------- profile


@dataclass(frozen=True)
class ServerChoice:
    """The server profile, prefix movement and swap bandwidth asked for (None: defaults)."""

    profile: str | None = None
    movement: str | None = None
    swap_bytes_per_s: float | None = None

    def resolve(self, family_profile: str | None) -> ServerProfile:
        """The profile to use, with the swap bandwidth override applied."""
        prof = get_profile(self.profile or family_profile or DEFAULT_PROFILE)
        if self.swap_bytes_per_s is not None:
            _check_positive("swap_bytes_per_s", self.swap_bytes_per_s)
            prof = prof.with_swap(self.swap_bytes_per_s)
        return prof

    def apply(
        self, server: ServerSpec, family_profile: str | None, budget_given: bool
    ) -> ServerSpec:
        """``server`` (a family's default) re-timed for the profile and movement asked for.

        The profile's KV budget, where it has one, replaces the family's prefix-share
        rule unless the caller sized the budget itself (``budget_given``).
        """
        prof = self.resolve(family_profile)
        server = prof.retime(server, self.movement or prof.movement)
        if prof.kv_capacity_tokens is not None and not budget_given:
            server = replace(server, kv_capacity_tokens=prof.kv_capacity_tokens)
        return server


# --------------------------------------------------------------------------- generate


def _check_positive(name: str, x: Any, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    ok = isinstance(x, kind) and not isinstance(x, bool) and math.isfinite(x) and x > 0
    if not ok:
        what = "a positive integer" if integer else "a finite number > 0"
        raise InputError(f"{name}: must be {what}, got {x!r}")


def generate(
    name: str,
    *,
    num_tasks: int = 100,
    seed: int = 0,
    load: float | None = None,
    rate: float | None = None,
    kv_capacity_tokens: int | None = None,
    max_running: int | None = None,
    chunk_tokens: int | None = None,
    prediction_sigma: float = 0.0,
    token_scale: float = 1.0,
    timing: str = "calibrated",
    profile: str | None = None,
    movement: str | None = None,
    swap_bytes_per_s: float | None = None,
    **params: Any,
) -> Instance:
    """Draw an instance of workload family ``name``.

    Arrivals are Poisson: at ``rate`` tasks per second (per step with ``timing="step"``) or
    at the rate that gives load factor ``load`` (``rate * mean task demand``; default
    :data:`DEFAULT_LOAD` when neither is given). ``kv_capacity_tokens``, ``max_running``
    and ``chunk_tokens`` override the family's default server (token counts before
    ``token_scale``). ``prediction_sigma > 0`` sets each stage's
    ``predicted_output_tokens`` to ``max(1, round(true * lognormal(0, sigma)))``.
    ``token_scale`` divides every token count (prefixes, inputs, outputs, KV budget, chunk)
    rounding up; ``timing="step"`` uses the step model (integer arrivals). ``params`` are
    the family's own (see :func:`describe`). One seed drives everything, through three
    independent streams: structure, arrivals, predictions.

    ``profile`` names the server profile (``topas.profiles``; default: the family's, else
    the project's): its cost model, prefill chunk and, where it has one, its KV budget
    (which an explicit ``kv_capacity_tokens`` or ``prefix_share`` overrides).
    ``movement`` is ``"recompute"`` or ``"swap"`` (default: the profile's); a swap copies
    a prefix over the profile's host link, ``swap_bytes_per_s`` overriding its bandwidth.
    The instance records the profile (``server.profile``).
    """
    return _generate(
        name,
        num_tasks=num_tasks,
        seed=seed,
        load=load,
        rate=rate,
        kv_capacity_tokens=kv_capacity_tokens,
        max_running=max_running,
        chunk_tokens=chunk_tokens,
        prediction_sigma=prediction_sigma,
        token_scale=token_scale,
        timing=timing,
        free_stages=None,
        params=params,
        server_choice=ServerChoice(profile, movement, swap_bytes_per_s),
    )


def _generate(
    name: str,
    *,
    num_tasks: int,
    seed: int,
    load: float | None,
    rate: float | None,
    kv_capacity_tokens: int | None,
    max_running: int | None,
    chunk_tokens: int | None,
    prediction_sigma: float,
    token_scale: float,
    timing: str,
    free_stages: float | None,
    params: Mapping[str, Any],
    scaled_kv: int | None = None,
    server_choice: ServerChoice | None = None,
) -> Instance:
    """:func:`generate`; with ``free_stages`` (small instances), the default KV budget
    after scaling is the sum of prefixes plus room for ``free_stages`` average stages;
    ``scaled_kv`` sets the KV budget after scaling."""
    wl = get_workload(name)
    p = resolve_params(name, params)
    _check_positive("num_tasks", num_tasks, integer=True)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"seed: must be an integer >= 0, got {seed!r}")
    if load is not None and rate is not None:
        raise InputError("load and rate are mutually exclusive: give one of them")
    if load is not None:
        _check_positive("load", load)
    if rate is not None:
        _check_positive("rate", rate)
    if timing not in TIMINGS:
        raise InputError(f"timing: unknown {timing!r} (valid: {', '.join(TIMINGS)})")
    _check_positive("token_scale", token_scale)
    if (
        isinstance(prediction_sigma, bool)
        or not isinstance(prediction_sigma, int | float)
        or not math.isfinite(prediction_sigma)
        or prediction_sigma < 0
    ):
        raise InputError(
            f"prediction_sigma: must be a finite number >= 0, got {prediction_sigma!r}"
        )

    structure_rng, arrival_rng, prediction_rng = np.random.default_rng(seed).spawn(3)
    share = p.pop("prefix_share")
    draft = wl.build(structure_rng, num_tasks, p)

    server = wl.default_server(draft.agents, share)
    choice = server_choice or ServerChoice()
    server = choice.apply(
        server, wl.profile, budget_given="prefix_share" in params or scaled_kv is not None
    )
    if kv_capacity_tokens is not None:
        server = replace(server, kv_capacity_tokens=kv_capacity_tokens)
    if chunk_tokens is not None:
        server = replace(server, chunk_tokens=chunk_tokens)
    if max_running is not None:
        server = replace(server, max_running=max_running)
    agents, stage_lists, server = _scale(draft.agents, draft.tasks, server, float(token_scale))
    if scaled_kv is not None:
        server = replace(server, kv_capacity_tokens=scaled_kv)
    elif free_stages is not None and kv_capacity_tokens is None:
        server = replace(server, kv_capacity_tokens=_tight_kv(agents, stage_lists, free_stages))
    if timing == "step":
        server = replace(server, cost_model=StepCost(1.0))

    tasks = [
        Task(id=f"t{i}", arrival=0.0, stages=stages, workflow=name)
        for i, stages in enumerate(stage_lists)
    ]
    if rate is None:
        load = DEFAULT_LOAD if load is None else load
        agents_by_id = {a.id: a for a in agents}
        rate = rate_for_load(load, mean_task_demand_s(tasks, agents_by_id, server))
        label = f"load{load:g}"
    else:
        label = f"rate{rate:g}"
    arrivals = poisson_arrivals(arrival_rng, num_tasks, rate, integer=timing == "step")

    final = []
    for t, arrival in zip(tasks, arrivals, strict=True):
        stages = t.stages
        if prediction_sigma > 0:
            noise = prediction_rng.lognormal(0.0, prediction_sigma, size=len(stages))
            stages = tuple(
                replace(s, predicted_output_tokens=max(1, round(s.output_tokens * float(e))))
                for s, e in zip(stages, noise, strict=True)
            )
        final.append(Task(id=t.id, arrival=arrival, stages=stages, workflow=name))

    inst_name = f"{name}-n{num_tasks}-{label}-seed{seed}"
    if token_scale != 1:
        inst_name += f"-scale{token_scale:g}"
    if timing == "step":
        inst_name += "-step"
    if prediction_sigma > 0:
        inst_name += f"-sigma{prediction_sigma:g}"
    return Instance(server=server, agents=agents, tasks=tuple(final), name=inst_name)


def small_instance(
    family: str,
    seed: int = 0,
    num_tasks: int = 3,
    *,
    token_scale: float = SMALL_TOKEN_SCALE,
    load: float | None = None,
    rate: float | None = None,
    kv_capacity_tokens: int | None = None,
    max_running: int | None = None,
    prediction_sigma: float = 0.0,
    free_stages: float = SMALL_FREE_STAGES,
    profile: str | None = None,
    **params: Any,
) -> Instance:
    """A scaled-down step-timing instance for the exact oracle.

    The family is shrunk by its ``small_params`` (2-4 agents, 3-5 stages per task, so 2-4
    tasks have 6-20 stages), every token count is divided by ``token_scale``, and
    ``timing="step"``. The KV budget (unless given, in scaled tokens) holds all prefixes
    plus ``free_stages`` average stages: with every prefix resident only ~2 stages run, so
    the prefix/batch tradeoff binds even with a handful of tasks. Without
    ``load`` or ``rate``, arrivals are Poisson at ``(num_tasks-1)/SMALL_ARRIVAL_SPAN_STEPS``
    tasks per step. ``profile`` (default: the family's) sets the chunk and the swap rate
    (in the step model the cost model is the step's). ``params`` override the shrunk
    family parameters.
    """
    wl = get_workload(family)
    merged = dict(wl.small_params) | params
    if load is None and rate is None:
        rate = max(1, num_tasks - 1) / SMALL_ARRIVAL_SPAN_STEPS
    return _generate(
        family,
        num_tasks=num_tasks,
        seed=seed,
        load=load,
        rate=rate,
        kv_capacity_tokens=None,
        max_running=max_running,
        chunk_tokens=None,
        prediction_sigma=prediction_sigma,
        token_scale=token_scale,
        timing="step",
        free_stages=free_stages,
        params=merged,
        scaled_kv=kv_capacity_tokens,
        server_choice=ServerChoice(profile),
    )
