"""The policy registry, spec strings, user and plug-in policies, and the baselines' choices.

Baselines are run directly on hand-built States (no simulator) so that each test
pins one choice: admission order, eviction order, prefetch, retraction victim.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
from conftest import kv_of, make, stage, task

from topas.errors import InputError
from topas.policies import (
    BASELINES,
    REGISTRY,
    Policy,
    PolicyContext,
    PolicySpecError,
    available,
    make_policy,
)
from topas.policies.baselines import LPM, KVFlow
from topas.simulator import simulate
from topas.state import (
    Decision,
    State,
    TaskInfo,
    apply,
    apply_inplace,
    complete_stage,
    prefix_ready,
    task_arrives,
)

# --------------------------------------------------------------------------- helpers


def released(inst) -> State:
    """All tasks released in arrival order, each at its arrival time."""
    state = State.initial(inst, kv_of(inst))
    for t in sorted(inst.tasks, key=lambda t: t.arrival):
        state.time = t.arrival
        task_arrives(state, TaskInfo.of(t, t.arrival))
    return state


def make_resident(state: State, *agents: str) -> None:
    for agent in agents:
        apply_inplace(state, Decision(load=(agent,)))
        prefix_ready(state, agent)


def ready(spec: str, inst, timing: str = "step") -> Policy:
    policy = make_policy(spec)
    policy.reset(PolicyContext(server=inst.server, timing=timing))
    return policy


# --------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", BASELINES)
def test_make_policy_for_every_registered_name(name):
    policy = make_policy(name)
    assert type(policy) is REGISTRY[name]
    assert isinstance(policy, Policy)
    assert policy.name == name and policy.spec() == name


def test_available_lists_the_registry_sorted():
    names = available()
    assert set(BASELINES) <= set(names) and set(REGISTRY) <= set(names)
    assert names == sorted(names)


def test_spec_parameters_set_typed_fields():
    lpm = make_policy("lpm:max_sorted=3")
    assert isinstance(lpm, LPM)
    assert lpm.max_sorted == 3 and type(lpm.max_sorted) is int
    assert lpm.spec() == "lpm:max_sorted=3"
    kv = make_policy("kvflow:prefetch=0,horizon=2")
    assert isinstance(kv, KVFlow)
    assert kv.prefetch is False
    assert kv.horizon == 2 and type(kv.horizon) is int
    assert kv.spec() == "kvflow:prefetch=0,horizon=2"
    assert make_policy("kvflow:prefetch=true").prefetch is True
    assert make_policy("kvflow: horizon = 3 ,").horizon == 3
    assert make_policy("  lpm  ").spec() == "lpm"
    assert make_policy("lpm").max_sorted == 128  # SGLang's WAITING_QUEUE_PREFIX_MATCH_MAX


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty policy spec"),
        ("   ", "empty policy spec"),
        ("nosuch", r"unknown policy 'nosuch'; choose from .*fcfs.*"),
        ("nosuch:x=1", r"unknown policy 'nosuch'; choose from "),
        ("lpm:foo=1", r"unknown parameter 'foo' \(parameters: max_sorted\)"),
        ("kvflow:foo=1", r"unknown parameter 'foo' \(parameters: prefetch, horizon\)"),
        ("fcfs:x=1", r"unknown parameter 'x' \(parameters: none\)"),
        ("lpm:max_sorted=abc", r"max_sorted='abc' is not a valid int"),
        ("kvflow:horizon=1.5", r"horizon='1.5' is not a valid int"),
        ("kvflow:prefetch=maybe", r"prefetch='maybe' is not a valid bool"),
        ("lpm:max_sorted", r"expected key=value, got 'max_sorted'"),
        ("kvflow:prefetch=1,horizon", r"expected key=value, got 'horizon'"),
    ],
)
def test_bad_specs_raise_one_line_errors(spec, message):
    with pytest.raises(PolicySpecError, match=message) as info:
        make_policy(spec)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("topas:search=best", "search: unknown mode 'best'"),
        ("topas:max_changes=0", "max_changes >= 1"),
        ("topas-rollout:bases=lpm+topas", "first base must be a TOPAS"),
        ("topas-rollout:bases=topas+lpm:nope=1", "unknown parameter 'nope'"),
    ],
)
def test_a_parameter_out_of_range_is_refused_as_the_policy_is_built(spec, message):
    # Policy.check runs in make_policy, so a study refuses the spec before any run
    with pytest.raises(InputError, match=message) as info:
        make_policy(spec)
    assert "\n" not in str(info.value)


def test_unknown_name_lists_every_choice():
    with pytest.raises(PolicySpecError) as info:
        make_policy("nosuch")
    choices = str(info.value).split("choose from ", 1)[1]
    assert choices.split(", ") == available()


# --------------------------------------------------------------------------- user classes

USER_POLICY = '''
from dataclasses import dataclass

from topas.policies import Policy, admit_in_order


@dataclass
class Shortest(Policy):
    """Shortest input first."""

    depth: int = 0
    greedy: bool = False
    rate: float = 1.0

    def decide(self, state):
        order = sorted(state.waiting, key=lambda r: (state.stage(r).input_tokens, r))
        return admit_in_order(state, order, stop_at_first_misfit=not self.greedy).decision()


class NotAPolicy:
    pass
'''


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """Write a package and a top-level module holding a policy class onto sys.path."""
    pkg = tmp_path / "topas_testpkg_user"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "pol.py").write_text(USER_POLICY)  # real annotations
    future = "from __future__ import annotations\n"
    (tmp_path / "topas_test_usermod.py").write_text(future + USER_POLICY)  # string ones
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("topas_testpkg_user", "topas_testpkg_user.pol", "topas_test_usermod"):
        sys.modules.pop(name, None)


def test_user_policy_class_by_package_module(user_modules):
    policy = make_policy("topas_testpkg_user.pol:Shortest")
    assert type(policy).__name__ == "Shortest" and isinstance(policy, Policy)
    assert policy.depth == 0 and policy.greedy is False
    assert policy.spec() == "topas_testpkg_user.pol:Shortest"
    policy = make_policy("topas_testpkg_user.pol:Shortest:depth=4,rate=0.5")
    assert policy.depth == 4 and type(policy.depth) is int
    assert policy.rate == 0.5 and type(policy.rate) is float


def test_user_policy_class_by_top_level_module_with_params(user_modules):
    spec = "topas_test_usermod:Shortest:depth=1,greedy=yes"
    policy = make_policy(spec)
    assert type(policy).__module__ == "topas_test_usermod"
    assert policy.depth == 1 and type(policy.depth) is int
    assert policy.greedy is True
    assert policy.spec() == spec
    assert make_policy("topas_test_usermod:Shortest").spec() == "topas_test_usermod:Shortest"


def test_a_user_policy_runs_in_the_simulator(user_modules):
    inst = make(
        {"a": 4, "b": 6},
        [
            task("t1", 0, stage("s1", "a", 8, 2), stage("s2", "b", 3, 1, ["s1"])),
            task("t2", 0, stage("s1", "b", 2, 2)),
        ],
        30,
    )
    sched = simulate(inst, make_policy("topas_test_usermod:Shortest"), timing="step")
    assert len(sched.completed()) == 3


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("topas_testpkg_user.pol:Nope", r"has no policy class 'Nope'"),
        ("topas_testpkg_user.pol:NotAPolicy", r"has no policy class 'NotAPolicy'"),
        ("topas_testpkg_user.missing:X", r"cannot import topas_testpkg_user.missing"),
        ("topas_testpkg_user.pol", r"expected package.module:Class"),
        ("topas_test_usermod", r"expected package.module:Class"),
        (
            "topas_test_usermod:Shortest:bogus=1",
            r"unknown parameter 'bogus' \(parameters: depth, greedy, rate\)",
        ),
        ("topas_test_usermod:Shortest:depth=x", r"depth='x' is not a valid int"),
        ("topas_testpkg_user.pol:Shortest:rate=fast", r"rate='fast' is not a valid float"),
    ],
)
def test_bad_user_specs(user_modules, spec, message):
    with pytest.raises(PolicySpecError, match=message) as info:
        make_policy(spec)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- entry points


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A fake installed distribution registering ``mine`` under ``topas.policies``."""
    dist = tmp_path / "myplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[topas.policies]\nmine = myplug_mod:MyPolicy\n")
    (tmp_path / "myplug_mod.py").write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass

            from topas.policies import Policy
            from topas.state import Decision


            @dataclass
            class MyPolicy(Policy):
                k: int = 0

                def decide(self, state):
                    return Decision()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("myplug_mod", None)


def test_entry_point_policies_are_found(plugin):
    assert "mine" in available()
    assert set(BASELINES) <= set(available())
    policy = make_policy("mine")
    assert type(policy).__name__ == "MyPolicy"
    assert type(policy).__module__ == "myplug_mod"
    assert policy.spec() == "mine"
    policy = make_policy("mine:k=2")
    assert policy.k == 2 and policy.spec() == "mine:k=2"
    with pytest.raises(PolicySpecError, match=r"unknown parameter 'j' \(parameters: k\)"):
        make_policy("mine:j=1")
    with pytest.raises(PolicySpecError, match=r"choose from .*mine"):
        make_policy("nosuch")


# --------------------------------------------------------------------------- LPM


def lpm_world():
    """Four single-stage tasks arriving 0..3: agents a (absent), b (20), c (30) resident."""
    inst = make(
        {"a": 10, "b": 20, "c": 30},
        [
            task("w0", 0, stage("s", "a", 5, 1)),
            task("w1", 1, stage("s", "b", 5, 1)),
            task("w2", 2, stage("s", "a", 5, 1)),
            task("w3", 3, stage("s", "c", 5, 1)),
        ],
        200,
    )
    state = released(inst)
    make_resident(state, "b", "c")
    return inst, state


W0, W1, W2, W3 = ("w0", "s"), ("w1", "s"), ("w2", "s"), ("w3", "s")


@pytest.mark.parametrize(
    ("spec", "order"),
    [
        ("lpm", [W3, W1, W0, W2]),  # longest resident prefix first, then FCFS
        ("lpm:max_sorted=4", [W3, W1, W0, W2]),  # 4 waiting: not more than 4
        ("lpm:max_sorted=3", [W0, W1, W2, W3]),  # more than 3 wait: FCFS
        ("fcfs", [W0, W1, W2, W3]),
    ],
)
def test_lpm_sorts_by_resident_prefix_unless_too_many_wait(spec, order):
    inst, state = lpm_world()
    decision = ready(spec, inst).decide(state)
    assert list(decision.admit) == order
    apply(state, decision)


def test_lpm_switches_order_as_the_queue_shrinks():
    inst, state = lpm_world()
    policy = ready("lpm:max_sorted=2", inst)
    state.max_running = 1
    assert policy.decide(state).admit == (W0,)  # 4 wait: FCFS
    state = apply(state, Decision(admit=(W0,)))  # a loads
    prefix_ready(state, "a")
    complete_stage(state, W0, 1.0)
    state = apply(state, Decision(admit=(W1,)))
    state.max_running = None
    # w2 (a, 10 resident) and w3 (c, 30 resident) wait: sorted, though w2 came first
    assert policy.decide(state).admit == (W3, W2)


# --------------------------------------------------------------------------- victims


def victim_world():
    inst = make(
        {"a": 1},
        [task(f"t{i}", 0, stage("s", "a", inp, 4)) for i, inp in enumerate([5, 3, 8, 8])],
        100,
    )
    state = released(inst)
    make_resident(state, "a")
    apply_inplace(state, Decision(admit=tuple(state.waiting)))
    for i, gen in enumerate([2, 0, 0, 0]):
        state.running[(f"t{i}", "s")].generated = gen
    return state


@pytest.mark.parametrize("spec", ["policy", *BASELINES])
@pytest.mark.parametrize(
    ("cands", "victim"),
    [
        ([0, 1, 2, 3], 2),  # fewest generated (0), then longest input (8), then the ref
        ([0, 1], 1),  # 0 generated beats 2, although the input is shorter
        ([0, 1, 3], 3),
        ([0], 0),
    ],
)
def test_default_choose_victim_follows_sglang(spec, cands, victim):
    state = victim_world()
    policy = Policy() if spec == "policy" else make_policy(spec)
    refs = [(f"t{i}", "s") for i in cands]
    assert policy.choose_victim(state, refs) == (f"t{victim}", "s")
    assert policy.choose_victim(state, list(reversed(refs))) == (f"t{victim}", "s")


# --------------------------------------------------------------------------- baselines


def baseline_world():
    """A mid-run state: DAG tasks, two resident prefixes, one running stage, tight KV.

    plan (30) and test (10) resident; t3/s1 (test) running; t1/s1 finished, so t1/s2
    waits; capacity 120, 75 committed, at most 3 running.
    """
    inst = make(
        {"plan": 30, "code": 20, "test": 10, "review": 15},
        [
            task(
                "t1",
                0,
                stage("s1", "plan", 20, 10),
                stage("s2", "code", 30, 20, ["s1"]),
                stage("s3", "test", 10, 5, ["s2"]),
            ),
            task("t2", 1, stage("s1", "code", 15, 5), stage("s2", "review", 10, 5, ["s1"])),
            task("t3", 2, stage("s1", "test", 25, 10), stage("s2", "test", 5, 5)),
            task("t4", 3, stage("s1", "review", 40, 10), stage("s2", "plan", 5, 5, ["s1"])),
        ],
        120,
        max_running=3,
    )
    state = released(inst)
    make_resident(state, "plan", "test")
    apply_inplace(state, Decision(admit=(("t1", "s1"), ("t3", "s1"))))
    state.time = 4.0
    complete_stage(state, ("t1", "s1"), 4.0)
    assert state.kv_committed == 75
    return inst, state


SPECS = [*BASELINES, "lpm:max_sorted=1", "kvflow:prefetch=0", "kvflow:horizon=3"]


@pytest.mark.parametrize("timing", ["step", "calibrated"])
@pytest.mark.parametrize("spec", SPECS)
def test_baselines_decide_feasibly_and_deterministically(spec, timing):
    inst, state = baseline_world()
    policy = ready(spec, inst, timing)
    decision = policy.decide(state)
    assert isinstance(decision, Decision)
    assert decision.admit, "something fits: a baseline admits it"
    new = apply(state, decision)
    assert new.kv_committed <= new.capacity
    assert policy.decide(state) == decision  # not applied: same answer
    assert ready(spec, inst, timing).decide(state.copy()) == decision  # a fresh instance
    again = ready(spec, inst, timing)
    again.decide(state)
    assert again.decide(new) == ready(spec, inst, timing).decide(new)


def test_kvflow_prefetches_the_agents_due_next():
    inst = make(
        {"a": 10, "b": 10, "c": 10},
        [
            task(
                "t1",
                0,
                stage("s1", "a", 5, 5),
                stage("s2", "b", 5, 5, ["s1"]),
                stage("s3", "c", 5, 5, ["s2"]),
            )
        ],
        60,
    )
    state = released(inst)
    make_resident(state, "a")
    state = apply(state, Decision(admit=(("t1", "s1"),)))
    assert ready("kvflow", inst).decide(state).load == ("b",)  # b is 1 step away
    assert ready("kvflow:horizon=2", inst).decide(state).load == ("b", "c")
    assert ready("kvflow:horizon=0", inst).decide(state).load == ()
    assert ready("kvflow:prefetch=0", inst).decide(state).load == ()
    apply(state, ready("kvflow:horizon=2", inst).decide(state))


def test_kvflow_evicts_the_agent_furthest_from_execution():
    inst = make(
        {"a": 10, "b": 10, "c": 10, "d": 10, "e": 10},
        [
            task("t1", 0, stage("s1", "e", 10, 10)),  # needs 30 of 20 free
            task("t2", 1, stage("s1", "d", 1, 1), stage("s2", "a", 1, 1, ["s1"])),
            task(
                "t3",
                2,
                stage("s1", "d", 1, 1),
                stage("s2", "d", 1, 1, ["s1"]),
                stage("s3", "b", 1, 1, ["s2"]),
            ),
        ],
        50,
        max_running=1,
    )
    state = released(inst)
    make_resident(state, "a", "b", "c")
    assert state.evictable() == ["a", "b", "c"] and state.free_kv == 20
    # steps to execution: a 1, b 2, c none (infinitely far)
    policy = ready("kvflow:prefetch=0", inst)
    assert policy.eviction_order(state) == ["c", "b", "a"]
    decision = policy.decide(state)
    assert decision.admit == (("t1", "s1"),) and decision.evict == ("c",)
    assert ready("fcfs", inst).decide(state).evict == ("a",)  # LRU
    apply(state, decision)
