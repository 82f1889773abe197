"""Shadow decisions: where two policies part on the same states.

Every run simulates one policy of ``--policies`` (calibrated timing, the instances of
``analysis/compare_policies.py``). At each of its decisions the ``--shadow`` policy is
asked too, on the same state, and its answer is thrown away: the run is the policy's
own, JCTs included. Each decision's admissions are compared with the shadow's:

- ``common``: admitted by both;
- ``policy only``: admitted by the policy and not by the shadow;
- ``shadow only``: admitted by the shadow and not by the policy, split by why the policy
  left it out: ``held`` (listed in its ``Decision.held``: kept out on purpose, such as a
  stage whose prompt TOPAS drains or does not load), ``absent`` (its agent's prompt is
  absent and the policy neither holds it nor brings the prompt in: no stage of that agent
  admitted, no load) or ``ranked lower`` (the policy admitted other stages in its place).

For the stages each policy admits alone, the row also gives their tasks' mean age (seconds
since release) and mean predicted work left (seconds of predicted service of the task's
unfinished stages), so an order that is more or less like SRPT shows. The summary gives
each count per run, averaged over the seeds; a stage left out at several decisions counts
at each.

    python analysis/shadow_decisions.py [--workloads metagpt-tl] [--loads 1.2]
        [--seeds 5 | --seeds 20,23] [--tasks 200] [--policies topas] [--shadow
        topas-greedy] [--tuning] [--jobs N] [--out results/shadow_decisions]
        [--no-progress] [--resume]

``--seeds N`` means the first N reporting seeds (20, 21, ...); tuning seeds are refused
unless ``--tuning``. Writes OUT/{config.json, runs.csv, summary.md} (each file atomically,
after every run has finished) and prints summary.md. Bad input: one ``error: ...`` line
on stderr, exit status 2, nothing created.

A policy keeps state across decisions; the shadow's state follows decisions it did not
make. TOPAS and `topas-greedy` detect that (their incremental syncs check counts and fall
back to full differences), and every shadow admission is checked to be a waiting stage.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_policies as cp  # noqa: E402
import experiments as ex  # noqa: E402

from topas.instance import Instance, StageRef  # noqa: E402
from topas.policies import make_policy  # noqa: E402
from topas.policies.base import Policy, PolicyContext  # noqa: E402
from topas.schedule import Schedule, evaluate  # noqa: E402
from topas.simulator import simulate  # noqa: E402
from topas.state import Decision, Phase, PrefixStatus, State  # noqa: E402
from topas.studies import md_table  # noqa: E402

COUNTS = ("common", "policy_only", "shadow_held", "shadow_absent", "shadow_ranked")


class Shadowed(Policy):
    """The policy of spec ``policy`` decides; the one of spec ``shadow`` is asked on the
    same state, and :attr:`tally` counts where their admissions part (module docstring).
    Everything the engine asks besides ``decide`` is the policy's."""

    def __init__(self, policy: str, shadow: str) -> None:
        self.policy, self.shadow = make_policy(policy), make_policy(shadow)
        self.name = self.policy.name
        self.event_driven = self.policy.event_driven

    def reset(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        self.policy.reset(ctx)
        self.shadow.reset(ctx)
        sums = ("policy_age", "policy_left", "shadow_age", "shadow_left")
        self.tally: dict[str, float] = dict.fromkeys(("decisions", "agree", *COUNTS, *sums), 0.0)

    def spec(self) -> str:
        return self.policy.spec()

    def eviction_order(self, state: State) -> list[str]:
        return self.policy.eviction_order(state)

    def choose_victim(self, state: State, candidates: Sequence[StageRef]) -> StageRef:
        return self.policy.choose_victim(state, candidates)

    def decide(self, state: State) -> Decision:
        mine = self.policy.decide(state)
        other = self.shadow.decide(state)
        stray = [ref for ref in other.admit if ref not in state.waiting]
        if stray:
            raise AssertionError(f"shadow {self.shadow.spec()} admits {stray[0]}, not waiting")
        self._count(state, mine, other)
        return mine

    def _count(self, state: State, mine: Decision, other: Decision) -> None:
        t = self.tally
        a, b, held = set(mine.admit), set(other.admit), set(mine.held)
        brought = {state.agent_of(ref) for ref in a} | set(mine.load)  # prompts it serves
        t["decisions"] += 1
        t["agree"] += a == b
        t["common"] += len(a & b)
        t["policy_only"] += len(a - b)
        for ref in sorted(b - a):
            agent = state.agent_of(ref)
            if ref in held:
                t["shadow_held"] += 1
            elif state.prefixes[agent].status is PrefixStatus.ABSENT and agent not in brought:
                t["shadow_absent"] += 1
            else:
                t["shadow_ranked"] += 1
        for who, refs in (("policy", a - b), ("shadow", b - a)):
            for ref in refs:
                t[f"{who}_age"] += state.time - state.tasks[ref[0]].release
                t[f"{who}_left"] += self._work_left(state, ref[0])

    def _work_left(self, state: State, tid: str) -> float:
        """Predicted service (s) of the task's unfinished stages."""
        info = state.tasks[tid]
        return sum(
            self.ctx.predict.service_s(s.input_tokens, s.predicted_output)
            for sid, s in info.stages.items()
            if state.phase[(tid, sid)] is not Phase.DONE
        )


# --------------------------------------------------------------------------- the study


def build_parser() -> ex.Parser:
    ap = ex.Parser(description=__doc__.splitlines()[0])
    ex.add_grid_options(
        ap,
        workloads="metagpt-tl",
        loads="1.2",
        policies="topas",
        out="results/shadow_decisions",
    )
    ap.add_argument("--shadow", default="topas-greedy", help="the policy asked alongside")
    return ap


def config_from_args(args: Any) -> dict[str, Any]:
    """Validated parameters (raises :class:`experiments.CliError`)."""
    cfg = ex.grid_config(args)
    shadow = ex.parse_policies(args.shadow, "--shadow")
    if len(shadow) != 1:
        raise ex.CliError(f"--shadow: one policy spec, got {len(shadow)}")
    cfg["shadow"] = shadow[0]
    cfg["kv_scale"] = 1.0  # compare_policies' jobs: the default budget
    ex.check_instances(
        cfg["workloads"], cfg["seeds"], cfg["loads"][0], cfg["tasks"], cfg["kv_scale"]
    )
    return cfg


def make_jobs(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """compare_policies' runs (the same instances), each with the shadow spec."""
    return [{**job, "shadow": cfg["shadow"]} for job in cp.make_jobs(cfg)]


def shadowed_run(
    inst: Instance, spec: str, shadow: str, timing: str = ex.TIMING, seed: int = 0
) -> tuple[Schedule, dict[str, float]]:
    """Simulate ``spec`` on ``inst`` with ``shadow`` asked alongside: the schedule (the
    policy's own) and the tally of :class:`Shadowed`."""
    both = Shadowed(spec, shadow)
    schedule = simulate(inst, both, timing=timing, seed=seed)
    return schedule, both.tally


def run_shadowed(job: Mapping[str, Any]) -> dict[str, Any]:
    """One run's row: the point, its mean and p99 JCT and the tally of
    :class:`Shadowed` (counts per run; ages and work left as means per stage)."""
    start = time.perf_counter()
    both = Shadowed(job["spec"], job["shadow"])
    _, schedule = ex.simulate_point(**{k: v for k, v in job.items() if k != "shadow"}, policy=both)
    t = both.tally
    metrics = evaluate(schedule)
    only = {"policy": t["policy_only"], "shadow": sum(t[k] for k in COUNTS[2:])}
    row: dict[str, Any] = {
        "workload": job["workload"],
        "load": job["load"],
        "seed": job["seed"],
        "policy": job["spec"],
        "shadow": job["shadow"],
        "num_tasks": job["num_tasks"],
        "mean_jct": metrics.mean_jct,
        "p99_jct": metrics.p99_jct,
        "decisions": int(t["decisions"]),
        "agree": int(t["agree"]),
        **{k: int(t[k]) for k in COUNTS},
    }
    for who in ("policy", "shadow"):
        n = max(only[who], 1)
        row[f"{who}_only_age_s"] = t[f"{who}_age"] / n
        row[f"{who}_only_left_s"] = t[f"{who}_left"] / n
    row["runtime_s"] = time.perf_counter() - start
    return row


# --------------------------------------------------------------------------- summary


def point_table(
    rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], w: str, load: float
) -> str:
    header = [
        "policy", "mean JCT (s)", "decisions", "same admissions", "common",
        "policy only", "shadow only: held", "absent", "ranked lower",
        "task age, policy / shadow only (s)", "work left, policy / shadow only (s)",
    ]  # fmt: skip
    body = []
    for spec in cfg["policies"]:
        point = ex.select(rows, workload=w, load=load, policy=spec)

        def m(key: str, point=point) -> float:
            return ex.mean_of(point, key)

        body.append(
            [
                f"`{spec}`",
                ex.fmt_s(m("mean_jct")),
                f"{m('decisions'):.0f}",
                f"{100 * m('agree') / max(m('decisions'), 1):.0f}%",
                *(f"{m(k):.0f}" for k in COUNTS),
                f"{m('policy_only_age_s'):.1f} / {m('shadow_only_age_s'):.1f}",
                f"{m('policy_only_left_s'):.1f} / {m('shadow_only_left_s'):.1f}",
            ]
        )
    return md_table(header, body) + "\n"


def summarize(
    rows: list[dict[str, Any]], cfg: Mapping[str, Any], command: str, wall_s: float
) -> str:
    lines = [
        "# Shadow decisions",
        "",
        f"Command: `{command}`",
        "",
        f"Calibrated timing; {cfg['tasks']} tasks per instance; seeds "
        f"{ex.fmt_list(cfg['seeds'])}; shadow `{cfg['shadow']}`, asked at every decision "
        "of each policy on the same state. " + ex.runtime_line(rows, wall_s, cfg["jobs"]),
        *ex.tuning_lines(cfg),
        "",
        "Counts are stages per run, averaged over the seeds (a stage left out at several "
        "decisions counts at each): admitted by both (common), by "
        "the policy alone, and by the shadow alone, split by why the policy left it out "
        "(held on purpose, its prompt absent, or other stages ranked before it). 'Same "
        "admissions': the share of decisions whose admitted sets are equal. Task age and "
        "work left: means over the stages each side admitted alone.",
        "",
    ]
    lines += ex.point_sections(cfg, lambda w, load: point_table(rows, cfg, w, load))
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    return ex.run_study(
        "shadow decisions",
        "analysis/shadow_decisions.py",
        argv,
        cfg,
        make_jobs(cfg),
        summarize,
        {},
        not args.no_progress,
        args.resume,
        runner=run_shadowed,
    )


if __name__ == "__main__":
    sys.exit(ex.run_cli(main))
