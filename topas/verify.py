"""Independent checks of schedules against the step model's rules.

:func:`verify_step` works from a schedule's records alone, step by step, without
the simulator: it is how simulated and oracle schedules are shown to be feasible.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from topas.instance import HostLoad
from topas.kv import step_need
from topas.schedule import Schedule, ScheduleError
from topas.timing import StepTiming


def verify_step(schedule: Schedule) -> None:
    """Check a step-model schedule against DESIGN rules 3-6; raise ScheduleError if broken.

    Independent of the simulator: works from the records alone, step by step.
    Stage KV (input + output) and a slot are held from admission to end (rule 9);
    a prefix holds its tokens from its load start to its end and is usable in
    ``[resident_from, end)``; every completed stage's ``[start, end)`` must lie in a
    residency interval of its agent; deps end before a stage starts; starts are at
    or after the release; durations match rule 2.

    Host mode (the serial transfer channel, extending rule 5): a load's transfer is
    ``[resident_from - l_a, resident_from)`` and the transfers of all agents are pairwise
    disjoint. A load queued behind another holds its KV from its request, so there
    ``resident_from - load_start >= l_a``; in recompute mode it is exactly ``l_a``.
    """
    inst = schedule.instance
    st = StepTiming.of(inst)
    host = isinstance(inst.server.prefix_load, HostLoad)

    def step(x: float) -> int:
        k = x / st.step_s
        if abs(k - round(k)) > 1e-6:
            raise ScheduleError(f"time {x} is not a whole step")
        return int(round(k))

    done = schedule.completed()
    residency: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    transfers: list[tuple[int, int, str]] = []  # (start, end, agent)
    for p in schedule.prefixes:
        ls, rs, e = step(p.load_start), step(p.resident_from), step(p.end)
        la = st.load_steps[p.agent]
        if rs - ls != la and not (host and rs - ls > la):
            raise ScheduleError(f"prefix {p.agent}: load lasts {rs - ls} steps, expected {la}")
        if rs > e:
            raise ScheduleError(f"prefix {p.agent}: ends at {e} before it is resident at {rs}")
        residency[p.agent].append((ls, rs, e))
        transfers.append((rs - la, rs, p.agent))
    if host:
        transfers.sort()
        for (_, e1, a1), (s2, _, a2) in zip(transfers, transfers[1:], strict=False):
            if s2 < e1:
                raise ScheduleError(
                    f"host transfers of {a1} (ends at {e1}) and {a2} (starts at {s2}) "
                    "overlap: one transfer at a time"
                )
    horizon = 0
    for r in schedule.runs:
        horizon = max(horizon, step(r.end))
    for p in schedule.prefixes:
        horizon = max(horizon, step(p.end))
    kv = np.zeros(horizon + 1, dtype=np.int64)
    slots = np.zeros(horizon + 1, dtype=np.int64)
    for r in schedule.runs:
        stage = inst.stage(r.ref)
        a, s, e = step(r.admit), step(r.start), step(r.end)
        if not (a <= s <= e):
            raise ScheduleError(
                f"stage {r.task}/{r.stage}: admit {a}, start {s}, end {e} out of order"
            )
        kv[a:e] += step_need(stage.input_tokens, stage.output_tokens)
        slots[a:e] += 1
        if r.preempted:
            continue
        release = st.release(inst.task_by_id[r.task].arrival)
        if s < release:
            raise ScheduleError(f"stage {r.task}/{r.stage} starts at {s} before release {release}")
        d = st.stage_steps(stage.input_tokens, stage.output_tokens)
        if e - s != d:
            raise ScheduleError(f"stage {r.task}/{r.stage} runs {e - s} steps, expected {d}")
        for dep in stage.deps:
            dep_end = step(done[(r.task, dep)].end)
            if dep_end > s:
                raise ScheduleError(
                    f"stage {r.task}/{r.stage} starts at {s} before dep {dep} ends at {dep_end}"
                )
        if not any(rs <= s and e <= pe for _, rs, pe in residency[stage.agent]):
            raise ScheduleError(
                f"stage {r.task}/{r.stage}: prefix {stage.agent} not resident "
                f"throughout steps {s}..{e - 1}"
            )
    for agent, ivs in residency.items():
        tokens = inst.agent_by_id[agent].prefix_tokens
        ivs.sort()
        for (_, _, e1), (l2, _, _) in zip(ivs, ivs[1:], strict=False):
            if l2 < e1:
                raise ScheduleError(f"prefix {agent}: overlapping residency intervals")
        for ls, _, e in ivs:
            kv[ls:e] += tokens
    cap = inst.server.kv_capacity_tokens
    over = np.nonzero(kv > cap)[0]
    if over.size:
        t = int(over[0])
        raise ScheduleError(f"step {t}: KV {int(kv[t])} exceeds capacity {cap}")
    if inst.server.max_running is not None:
        over = np.nonzero(slots > inst.server.max_running)[0]
        if over.size:
            t = int(over[0])
            raise ScheduleError(
                f"step {t}: {int(slots[t])} stages hold slots, max_running is "
                f"{inst.server.max_running}"
            )
