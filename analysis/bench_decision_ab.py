"""Decision time of two versions of the code, side by side in one process.

A wall-clock bench run before a change and another after it differ by the moment of this
shared machine as much as by the change (2x between runs is common). Here both versions
run in one process: each builds the decision bench's serving loop
(``analysis/bench_decision.py``) from its own source tree, and the two loops are stepped
alternately, one decision each, the order flipping every pair. The ratio of each pair of
decision times (new over base) cancels the machine's moment; its median is the figure.
Both loops make the same decisions when the change is a speed-up only, and the run says
whether they did (the first decision that differs, if one does: a change that was meant to
keep every decision and does not).

    python analysis/bench_decision_ab.py --base REV_OR_DIR [--new DIR] [--policy topas]
        [--agents 64] [--waiting 1000] [--decisions 400] [--warmup 20] [--seed 0]

``--base``: a git revision of this checkout (checked out into a temporary worktree,
removed afterwards) or a directory holding a source tree (``topas/`` and ``analysis/``).
``--new``: a directory, this checkout by default. Prints one summary line per ratio and
exits 0 (1 if the decisions differ, 2 on bad input).
"""

from __future__ import annotations

import contextlib
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OWN = ("topas", "bench_decision", "experiments")  # modules each tree loads for itself


@dataclass(frozen=True)
class Side:
    """One version's serving loop and policy."""

    tree: Path
    loop: object
    policy: object


@dataclass(frozen=True)
class Result:
    base_ms: list[float]
    new_ms: list[float]
    differs_at: int | None  # the first timed decision (0-based) the two made differently

    @property
    def ratios(self) -> list[float]:
        return [n / b for b, n in zip(self.base_ms, self.new_ms, strict=True)]


def _purge() -> None:
    """Forget every module a tree loads for itself, so that the next import reads another
    tree (the modules already imported stay alive in the objects that use them)."""
    for name in [m for m in sys.modules if m.split(".")[0] in OWN]:
        del sys.modules[name]


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Build and race the sides with none of the caller's own modules imported (each tree
    imports its own, and an import while deciding shows up as a new module); the caller's
    are put back afterwards, so that its classes stay the ones its modules name."""
    saved = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] in OWN}
    path = list(sys.path)
    _purge()
    try:
        yield
    finally:
        _purge()
        sys.modules.update(saved)
        sys.path[:] = path


def source_of(policy: object) -> str:
    """The file that defines ``policy``'s ``decide`` (read from its code, which outlives
    the module's entry in ``sys.modules``)."""
    return type(policy).decide.__code__.co_filename  # type: ignore[attr-defined]


def make_side(tree: Path, spec: str, agents: int, waiting: int, seed: int) -> Side:
    """The serving loop and policy of the source tree at ``tree``, built with its own
    modules (imported from it, then forgotten: the objects keep them). Within
    :func:`isolated`."""
    for need in ("topas", "analysis/bench_decision.py"):
        if not (tree / need).exists():
            raise ex.CliError(f"{tree}: not a source tree (no {need})")
    _purge()
    path = list(sys.path)
    sys.path[:0] = [str(tree / "analysis"), str(tree)]
    try:
        bench = importlib.import_module("bench_decision")
        policies = importlib.import_module("topas.policies")
        inst = bench.make_instance(agents, seed)
        loop = bench.ServingLoop(inst, waiting, seed)
        try:
            policy = policies.make_policy(spec)
        except ValueError as e:  # a bad spec (the tree's PolicySpecError)
            raise ex.CliError(f"--policy {spec}: {e}") from None
        policy.reset(policies.PolicyContext(server=inst.server, timing="calibrated", seed=seed))
        source = Path(source_of(policy))
        if not source.resolve().is_relative_to(tree.resolve()):  # shadowed by another copy
            raise ex.CliError(f"{tree}: its policy {spec!r} was loaded from {source}")
    finally:
        sys.path[:] = path
        _purge()
    return Side(tree, loop, policy)


def race(base: Side, new: Side, decisions: int, warmup: int) -> Result:
    """Step both loops alternately (``warmup`` untimed decisions first); time each
    ``decide`` and compare the two decisions of every pair (by their ``repr``: the two
    trees' ``Decision`` classes differ)."""
    times: tuple[list[float], list[float]] = ([], [])
    differs_at = None
    before = set(sys.modules)
    for i in range(warmup + decisions):
        made = [None, None]
        for j in (0, 1) if i % 2 == 0 else (1, 0):
            side = (base, new)[j]
            t0 = time.perf_counter_ns()
            d = side.policy.decide(side.loop.state)  # type: ignore[attr-defined]
            dt = time.perf_counter_ns() - t0
            side.loop.step(d)  # type: ignore[attr-defined]
            made[j] = repr(d)
            if i >= warmup:
                times[j].append(dt / 1e6)
        if made[0] != made[1] and differs_at is None:
            differs_at = i - warmup if i >= warmup else -1  # -1: already in the warm-up
    late = [m for m in sys.modules if m not in before and m.split(".")[0] in OWN]
    if late:  # they came from neither tree but from the installed package
        raise ex.CliError(
            f"the policy imports modules while deciding ({len(late)}, {late[0]} "
            "first): not comparable here"
        )
    return Result(times[0], times[1], differs_at)


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """``rev`` of this checkout in a temporary worktree (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="topas-ab-") as tmp:
        path = Path(tmp) / "tree"
        done = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise ex.CliError(f"--base {rev}: not a directory nor a revision of {ROOT}")
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                capture_output=True,
            )


@contextlib.contextmanager
def resolve(base: str) -> Iterator[Path]:
    path = Path(base)
    if path.is_dir():
        yield path.resolve()
    else:
        with checkout(base) as tree:
            yield tree


def summary(res: Result, spec: str, agents: int, waiting: int, base: str, new: Path) -> str:
    q1, _, q3 = statistics.quantiles(res.ratios, n=4) if len(res.ratios) > 1 else [0.0] * 3
    if res.differs_at is None:
        same = "the same decisions"
    elif res.differs_at < 0:
        same = "DIFFERENT decisions (already in the warm-up)"
    else:
        same = f"DIFFERENT decisions (from timed decision {res.differs_at})"
    return (
        f"{spec}, {agents} agents, {waiting} waiting, {len(res.ratios)} pairs: base ({base}) "
        f"p50 {statistics.median(res.base_ms):.3f} ms, new ({new}) p50 "
        f"{statistics.median(res.new_ms):.3f} ms; new/base per pair: median "
        f"{statistics.median(res.ratios):.3f} (quartiles {q1:.3f}-{q3:.3f}); {same}"
    )


def build_parser() -> ex.Parser:
    ap = ex.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="a git revision or a source tree directory")
    ap.add_argument("--new", default=str(ROOT), help="a source tree directory (default: here)")
    ap.add_argument("--policy", default="topas")
    ap.add_argument("--agents", default="64")
    ap.add_argument("--waiting", default="1000")
    ap.add_argument("--decisions", default="400", help="timed pairs")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    return ap


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    agents, waiting, decisions = (
        ex.parse_positive_int(getattr(args, name), f"--{name}")
        for name in ("agents", "waiting", "decisions")
    )
    if args.warmup < 0 or args.seed < 0:
        raise ex.CliError("--warmup and --seed: expected integers >= 0")
    new = Path(args.new)
    if not new.is_dir():
        raise ex.CliError(f"--new {args.new}: not a directory")
    with resolve(args.base) as base_tree, isolated():
        base, new_side = (
            make_side(t, args.policy, agents, waiting, args.seed)
            for t in (base_tree, new.resolve())
        )
        res = race(base, new_side, decisions, args.warmup)
    print(summary(res, args.policy, agents, waiting, args.base, new))
    return 0 if res.differs_at is None else 1


if __name__ == "__main__":
    sys.exit(ex.run_cli(main))
