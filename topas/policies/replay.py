"""Replay of a fixed step-model schedule, such as the oracle's.

The certificate that the oracle and the simulator implement the same model: the
oracle's schedule, replayed by this policy in the step engine, must give exactly the
oracle's objective. The policy loads, evicts and admits at the recorded steps and asks
to be woken at the next recorded action (DESIGN rule 12). It fails at the first action
the state does not allow, naming the step and the action, rather than dropping it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

from topas.errors import InputError
from topas.instance import StageRef
from topas.policies.base import Policy, PolicyContext
from topas.schedule import PrefixInterval, StageRun
from topas.state import Decision, State
from topas.timing import step_seconds


class ReplayDivergence(InputError):
    """A recorded schedule that the engine's state does not allow at some step."""


@dataclass
class Replay(Policy):
    """Admit, load and evict exactly as a recorded step schedule did.

    ``file``: a ``topas-result/1`` file that carries a ``schedule`` (``topas oracle``
    writes one; ``topas simulate --with-schedule`` too). In Python, build it with
    :meth:`of` from a :class:`~topas.schedule.Schedule`.
    """

    file: str = ""
    runs: list[StageRun] = field(default_factory=list, repr=False, init=False)
    prefixes: list[PrefixInterval] = field(default_factory=list, repr=False, init=False)
    name = "replay"
    event_driven = False

    @classmethod
    def of(cls, schedule) -> Replay:  # type: ignore[no-untyped-def]
        policy = cls()
        policy.runs = list(schedule.completed().values())
        policy.prefixes = list(schedule.prefixes)
        return policy

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        if self.file and not self.runs:
            self._read(self.file)
        step = step_seconds(ctx.server)
        self._admit: dict[int, list[StageRef]] = defaultdict(list)
        self._load: dict[int, list[str]] = defaultdict(list)
        self._evict: dict[int, list[str]] = defaultdict(list)
        for r in sorted(self.runs, key=lambda r: (r.start, r.task, r.stage)):
            self._admit[round(r.start / step)].append(r.ref)
        for p in self.prefixes:
            self._load[round(p.load_start / step)].append(p.agent)
            self._evict[round(p.end / step)].append(p.agent)
        self._steps = sorted(set(self._admit) | set(self._load) | set(self._evict))
        self._next = 0  # index in _steps of the next recorded step not yet replayed
        self._step_s = step

    def _read(self, path: str) -> None:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            sched = doc["schedule"]
            self.runs = [StageRun(**r) for r in sched["runs"] if not r.get("preempted")]
            self.prefixes = [PrefixInterval(**p) for p in sched["prefixes"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InputError(f"replay: {path}: not a result file with a schedule ({e})") from None

    def decide(self, state: State) -> Decision:
        """The actions recorded for this step; :class:`ReplayDivergence` at the first one
        the engine's state does not allow (or a recorded step the engine skipped)."""
        t = round(state.time / self._step_s)
        steps, i = self._steps, self._next
        if i < len(steps) and steps[i] < t:
            raise ReplayDivergence(
                f"replay: step {steps[i]}: not consulted there (next consulted at step {t})"
            )
        if i < len(steps) and steps[i] == t:
            self._next = i + 1
        for a in self._evict.get(t, ()):
            p = state.prefixes[a]
            if not p.evictable:
                raise ReplayDivergence(
                    f"replay: step {t}: evict {a!r}: prefix is {p.status.name.lower()} "
                    f"with {p.users} running stage(s)"
                )
        for ref in self._admit.get(t, ()):
            if ref not in state.waiting:
                phase = state.phase[ref].name.lower() if ref in state.phase else "not released"
                raise ReplayDivergence(
                    f"replay: step {t}: admit {ref[0]}/{ref[1]}: stage is {phase}"
                )
        wake = steps[self._next] * self._step_s if self._next < len(steps) else None
        return Decision(
            evict=tuple(self._evict.get(t, ())),
            load=tuple(self._load.get(t, ())),
            admit=tuple(self._admit.get(t, ())),
            wake_at=wake,
        )
