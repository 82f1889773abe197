"""The forward model of a lookahead: a run resumed from what a policy sees.

A rollout asks what happens if a policy decides ``D`` now and follows a base policy
``P`` afterwards. :class:`Forward` answers it with the simulator itself, so that the
forward model and the engine obey one set of rules:

- :meth:`Forward.instance` turns a :class:`~topas.state.State`'s released, unfinished
  tasks into an :class:`~topas.instance.Instance` whose true output lengths are the
  *predicted* ones (a stage already decoding past its prediction is given one more
  token), so nothing the policy may not see enters it;
- :meth:`Forward.completions` resumes the timing mode's engine from the State
  (``Engine.resumed``), applies ``D``, runs a copy of ``P`` (which sees the resumed state
  as the one it last decided on) until every known task is done, and returns when each
  finished.

No task arrives in the forward model: it knows the tasks released so far only.

The dependency rule of DESIGN.md keeps the simulator out of ``topas.policies``; a
lookahead policy is the one exception, and imports this module lazily.
"""

from __future__ import annotations

import copy
import io
import math
import pickle

from topas.instance import Agent, HostLoad, Instance, Stage, Task
from topas.policies.base import Policy, PolicyContext
from topas.simulator import ENGINES, PastCutoff, SimulationError
from topas.state import Decision, Phase, PrefixStatus, State, TaskInfo


class Forward:
    """Rollouts from a policy's view of a run (module doc); one per policy run, since it
    keeps the tasks it has built (a task is rebuilt only when a stage of it overruns its
    prediction)."""

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        self._engine = ENGINES[ctx.timing]
        self._tasks: dict[str, tuple[tuple[tuple[str, int], ...], Task]] = {}
        self._agents: tuple[Agent, ...] | None = None
        self.host = isinstance(ctx.server.prefix_load, HostLoad)
        self.loads_done: dict[str, float] = {}  # prompt now loading -> when it is resident
        self._channel_free = 0.0  # host: when the one transfer channel frees

    def note(self, state: State, decision: Decision) -> None:
        """Record when the loads that ``decision``, taken on ``state``, starts will be done
        (a load starts only with the decision that asks for it): in the engine's order
        (the admitted stages' prompts, then the prefetches), after one another on the
        host channel. A rollout's engine then knows when each prompt still loading will
        be resident."""
        loading = {a for a, p in state.prefixes.items() if p.status is PrefixStatus.LOADING}
        self.loads_done = {a: t for a, t in self.loads_done.items() if a in loading}
        order = [state.agent_of(r) for r in decision.admit] + list(decision.load)
        for a in dict.fromkeys(order):
            p = state.prefixes[a]
            if p.status is not PrefixStatus.ABSENT:
                continue
            start = max(state.time, self._channel_free) if self.host else state.time
            self.loads_done[a] = start + self.ctx.predict.load_s(p.tokens, p.host_copy)
            if self.host:
                self._channel_free = self.loads_done[a]

    def instance(self, state: State) -> Instance:
        """The released, unfinished tasks of ``state`` with their predicted lengths as the
        truth, on the run's server."""
        cap = state.capacity
        if self._agents is None or len(self._agents) != len(state.prefixes):
            self._agents = tuple(Agent(a, p.tokens) for a, p in state.prefixes.items())
        tasks = []
        for tid in [t for t in self._tasks if t not in state.tasks]:
            del self._tasks[tid]
        for tid, info in state.tasks.items():
            extra = _overruns(state, info)
            cached = self._tasks.get(tid)
            if cached is None or cached[0] != extra:
                cached = self._tasks[tid] = (extra, _task(info, dict(extra), state, cap))
            tasks.append(cached[1])
        return Instance(
            server=self.ctx.server, agents=self._agents, tasks=tuple(tasks), name="lookahead"
        )

    @staticmethod
    def freeze(policy: Policy, state: State) -> Frozen:
        """``policy``, which has just decided on ``state``, frozen for many rollouts."""
        return Frozen(policy, state)

    def completions(
        self,
        state: State,
        instance: Instance,
        decision: Decision,
        policy: Policy | Frozen,
        cutoff: float = math.inf,
    ) -> dict[str, float] | None:
        """When each task of ``state`` finishes if ``decision`` is applied now and a copy
        of ``policy`` (in step with ``state``; :class:`Frozen` for one copied many times)
        decides afterwards; None if that stalls (a base policy waiting for an arrival
        that the forward model does not have) or if the JCTs are sure to sum past
        ``cutoff`` (the run stops there). ``instance`` is :meth:`instance` of ``state``."""
        frozen = policy if isinstance(policy, Frozen) else Frozen(policy, state)
        engine = self._engine.resumed(instance, _Idle(), state, dict(self.loads_done), cutoff)
        engine.policy = frozen.thaw(engine.state)
        try:
            schedule = engine.run_from(decision)
        except (SimulationError, PastCutoff):
            return None
        done: dict[str, float] = {}
        for run in schedule.runs:
            if not run.preempted and run.end > done.get(run.task, -1.0):
                done[run.task] = run.end
        return done

    def jct_sum(
        self,
        state: State,
        instance: Instance,
        decision: Decision,
        policy: Policy | Frozen,
        cutoff: float = math.inf,
    ) -> float:
        """What a rollout minimises: the sum of the JCTs (completion less release) of
        ``state``'s tasks under :meth:`completions`; infinite if that stalls or passes
        ``cutoff``."""
        done = self.completions(state, instance, decision, policy, cutoff)
        if done is None:
            return math.inf
        return sum(done[tid] - info.release for tid, info in state.tasks.items())


def _overruns(state: State, info: TaskInfo) -> tuple[tuple[str, int], ...]:
    """A task's stages whose decoded tokens reach their prediction (after a retraction,
    or still running): each gets one token more than it has, as its length."""
    out = []
    for sid, st in info.stages.items():
        ref = (info.id, sid)
        if state.phase.get(ref) is Phase.DONE:
            continue
        made = state.generated.get(ref, 0)
        run = state.running.get(ref)
        if run is not None:
            made = max(made, run.generated)
        if made >= st.predicted_output:
            out.append((sid, made + 1))
    return tuple(out)


def _task(info: TaskInfo, lengths: dict[str, int], state: State, capacity: int) -> Task:
    """``info`` as a Task whose output lengths are the predicted ones (or ``lengths``),
    each cut to what fits beside its prompt (a noisy prediction may not)."""
    stages = []
    for sid in info.topo_order:
        st = info.stages[sid]
        room = capacity - state.prefixes[st.agent].tokens - st.input_tokens
        out = max(1, min(lengths.get(sid, st.predicted_output), room))
        stages.append(
            Stage(sid, st.agent, st.input_tokens, out, st.deps, predicted_output_tokens=out)
        )
    return Task(info.id, info.release, tuple(stages), info.workflow)


class Frozen:
    """A base policy as it is after deciding on ``state``, frozen once and thawed into a
    fresh copy for each rollout. In a copy, ``state`` is the rollout's resumed state (so
    a policy that keeps a view of the state it last decided on goes on incrementally),
    and what is immutable is shared: the run's context, its server and the tasks' infos.
    Frozen by pickling, which is several times faster than a deep copy per rollout; a
    policy that does not pickle is deep-copied at each thaw instead, to the same effect."""

    def __init__(self, policy: Policy, state: State) -> None:
        self._shared: dict[object, object] = {}
        ctx = getattr(policy, "ctx", None)
        if ctx is not None:
            self._shared |= {"ctx": ctx, "server": ctx.server}
        self._shared |= {("task", tid): info for tid, info in state.tasks.items()}
        self._ids = {id(obj): key for key, obj in self._shared.items()} | {id(state): "state"}
        self._policy, self._state = policy, state
        try:
            buf = io.BytesIO()
            _Pickler(buf, self._ids).dump(policy)
            self._data: bytes | None = buf.getvalue()
        except (pickle.PicklingError, TypeError, AttributeError):
            self._data = None

    def thaw(self, resumed: State) -> Policy:
        """A fresh copy of the policy that takes ``resumed`` for the state it froze on."""
        if self._data is None:
            memo = {i: self._shared[key] for i, key in self._ids.items() if key != "state"}
            return copy.deepcopy(self._policy, {**memo, id(self._state): resumed})
        objects = {**self._shared, "state": resumed}
        return _Unpickler(io.BytesIO(self._data), objects).load()


class _Pickler(pickle.Pickler):
    """Writes the objects ``ids`` names by their key instead of by value."""

    def __init__(self, buf: io.BytesIO, ids: dict[int, object]) -> None:
        super().__init__(buf, protocol=pickle.HIGHEST_PROTOCOL)
        self._ids = ids

    def persistent_id(self, obj: object) -> object:
        return self._ids.get(id(obj))


class _Unpickler(pickle.Unpickler):
    """Reads a :class:`_Pickler`'s keys back as the given objects."""

    def __init__(self, buf: io.BytesIO, objects: dict[object, object]) -> None:
        super().__init__(buf)
        self._objects = objects

    def persistent_load(self, pid: object) -> object:
        return self._objects[pid]


class _Idle(Policy):
    """The placeholder an engine is built with before the base policy's copy, which needs
    the engine's state, replaces it."""

    name = "idle"

    def decide(self, state: State) -> Decision:
        return Decision()
