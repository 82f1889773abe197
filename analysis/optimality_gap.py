"""Optimality gap of every registered policy (plus ablation specs) against the exact oracle.

The study behind ``topas gap`` (see ``topas/studies/gap.py`` and ``docs/gap.md``): small
step-model instances from each workload family, each solved exactly and run under every
policy; per policy the mean, p90 and max gap to the proven optimum (% and steps), the
share proven optimal per size, and gap intervals for unproven instances. The oracle is
clairvoyant while the policies are online.

    python analysis/optimality_gap.py [--instances 5] [--tasks 2,3,4] [--backend cpsat]
        [--policies lpm:max_sorted=4,kvflow:prefetch=0] [--only] [--jobs 2] [--resume]

``--policies`` adds specs to every registered policy (so ablations are compared with
all of them); ``--only`` runs just the specs given. Writes
results/gap/{config.json, runs.csv, summary.md, gap.png} and prints the summary. Solved
instances are kept in OUT/.checkpoint.pkl as they finish; after an interruption the same
command with ``--resume`` solves only the missing ones.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from topas.oracle.problem import BACKENDS
from topas.policies import split_specs
from topas.studies import default_policies
from topas.studies.checkpoint import add_resume_option, replayable
from topas.studies.gap import (
    DEFAULT_FAMILIES,
    REPORT_STUDY_SEED,
    TUNING_STUDY_SEEDS,
    GapConfig,
    is_tuning_seed,
    run_gap_study,
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=5, help="instances per family and size")
    ap.add_argument("--families", default=",".join(DEFAULT_FAMILIES))
    ap.add_argument("--tasks", default="2,3,4", help="task counts (sizes) to generate")
    ap.add_argument(
        "--policies",
        default="",
        help="extra policy specs, comma-separated, run alongside every registered policy "
        "(e.g. lpm:max_sorted=4); a spec's own key=value list may continue after commas",
    )
    ap.add_argument("--only", action="store_true", help="run only the --policies specs")
    ap.add_argument("--backend", choices=BACKENDS, default="cpsat")
    ap.add_argument("--time-limit", type=float, default=30.0, help="per instance, seconds")
    ap.add_argument("--threads", type=int, default=1, help="solver threads per instance")
    ap.add_argument(
        "--seed",
        type=int,
        default=REPORT_STUDY_SEED,
        help=f"study seed; reports refuse the tuning seeds ({TUNING_STUDY_SEEDS}) unless --tuning",
    )
    ap.add_argument(
        "--tuning", action="store_true", help="allow a tuning seed (to choose defaults)"
    )
    ap.add_argument("--jobs", type=int, default=1, help="instances solved in parallel")
    ap.add_argument("--profile", default=None, help="server profile (default: each family's)")
    ap.add_argument("--out", default="results/gap", help="output folder")
    ap.add_argument("--no-progress", action="store_true")
    add_resume_option(ap, "instances")
    return ap


def config_from_args(args: argparse.Namespace) -> GapConfig:
    extra = split_specs(args.policies)
    if args.only and not extra:
        raise ValueError("--only needs --policies")
    if args.only:
        policies: tuple[str, ...] | None = tuple(dict.fromkeys(extra))
    elif extra:
        policies = tuple(dict.fromkeys([*default_policies(), *extra]))
    else:
        policies = None
    if is_tuning_seed(args.seed) and not args.tuning:
        raise ValueError(
            f"--seed {args.seed} is a tuning seed ({TUNING_STUDY_SEEDS}): report on another, "
            "or pass --tuning to choose defaults on it"
        )
    try:
        tasks = tuple(int(n) for n in args.tasks.split(",") if n.strip())
    except ValueError:
        raise ValueError(f"--tasks: expected integers, got {args.tasks!r}") from None
    return GapConfig(
        families=tuple(f.strip() for f in args.families.split(",") if f.strip()),
        task_counts=tasks,
        instances=args.instances,
        policies=policies,
        backend=args.backend,
        time_limit=args.time_limit,
        seed=args.seed,
        jobs=args.jobs,
        threads=args.threads,
        profile=args.profile,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    command = shlex.join(["python", "analysis/optimality_gap.py", *replayable(argv)])
    try:
        config = config_from_args(args)
        summary = run_gap_study(
            config, args.out, progress=not args.no_progress, command=command, resume=args.resume
        )
    except ValueError as e:
        print(f"optimality_gap: error: {e}", file=sys.stderr)
        return 2
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
