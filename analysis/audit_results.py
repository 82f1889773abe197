"""Which committed study runs today's code still gives: an audit of ``docs/results``.

    python analysis/audit_results.py [--per-spec 2] [--max-load 1.2] [--rollout]
        [--jobs N] [--out docs/results/audit] [--no-progress]

A study's figures describe the code that ran it. When a default or the simulator changes
later, the study is run again, or its section in the docs says it was not; that
bookkeeping was kept by hand and once went wrong (docs/topas.md, "The regime map's two
halves"). This audit checks it. For each committed study of a script of :data:`SCRIPTS`
(``compare_policies.py``, ``reproduce_paper.py``, ``ablation.py``, ``jct_by_size.py``,
``shadow_decisions.py``: a folder under ``docs/results`` with ``config.json`` and
``runs.csv``), it rebuilds the study's jobs with the study's own builder from its
``config.json``, takes up to ``--per-spec`` runs of each policy spec at loads up to
``--max-load`` (the quick ones; chosen by a hash of the study and the job, so the same on
every call), runs them again with today's code and compares their mean and p99 JCT with
``runs.csv`` (10 significant digits). ``topas-rollout`` specs take minutes a run and are
left out unless ``--rollout``.

The summary lists per study the specs whose sampled runs all come out the same
("reproduce") and those that do not ("moved", with one example), and the commit that
last wrote the study's ``runs.csv``, whose code made those runs. A moved ``topas`` or
``topas-base`` spec is tried again with the defaults TOPAS took since switched back
(:data:`PINS`); the first such spec that gives its runs is named: the spec that repeats
that column today. Writes
OUT/{config.json, runs.csv, summary.md} (one row per run checked). Bad input: one
``error: ...`` line, exit status 2.

``tests/test_committed_runs.py`` runs the same check on a fixed sample of the headline
studies in every ``make test``; this script is the full audit, run by hand.
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex  # noqa: E402

from topas.studies import md_table, run_jobs, study_files, write_outputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
SCRIPTS = {
    "compare_policies": None,
    "reproduce_paper": None,
    "ablation": None,
    "jct_by_size": "run_sized",
    "shadow_decisions": "run_shadowed",
}
"""The studies audited, each with a ``make_jobs(cfg)``: script -> the function of it that
runs one job (None: ``experiments.run_point``)."""
METRICS = ("mean_jct", "p99_jct")
REL_TOL = 1e-8  # runs.csv keeps 10 significant digits
COLUMNS = (
    "study",
    "spec",
    "pinned",
    "workload",
    "load",
    "seed",
    "movement",
    "kv_capacity_tokens",
    "committed_mean_jct",
    "mean_jct",
    "committed_p99_jct",
    "p99_jct",
    "same",
    "reproduces_as",
    "runtime_s",
)
PINS = (
    ("token_floor=0",),  # token_floor=1 a default since 78bfb41 (2026-12-07)
    ("drain_load=0", "token_floor=0"),  # drain_load=1 since 3d2ec3a (2026-12-07)
    ("fill=search", "stall=0", "drain_load=0", "token_floor=0"),  # fill=auto,stall=1: 9f87b32
)
"""TOPAS's defaults of before, newest change first: a ``topas`` or ``topas-base`` spec whose
runs moved is tried with each of these switched back (keys it sets itself are kept), and
the first that gives its committed runs is named in the summary."""
PINNABLE = ("topas", "topas-base")


def study_module(name: str) -> ModuleType:
    """``analysis/<name>.py`` (one of :data:`SCRIPTS`), imported once."""
    if name not in SCRIPTS:
        raise ValueError(f"not an audited study script: {name}")
    return sys.modules.get(name) or importlib.import_module(name)


def script_of(cfg: Mapping[str, Any]) -> str | None:
    """The study script that wrote a ``config.json`` (None: not one this audit runs)."""
    words = shlex.split(str(cfg.get("command", "")))
    return next((s for s in SCRIPTS if f"analysis/{s}.py" in words), None)


def runner(script: str):  # type: ignore[no-untyped-def]
    """The function that runs one job of ``script``'s study."""
    name = SCRIPTS[script]
    return _run_point if name is None else getattr(study_module(script), name)


def _run_point(job: Mapping[str, Any]) -> dict[str, Any]:
    return ex.run_point(**job)


def study_jobs(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every job of the study that wrote ``cfg``, by its own builder."""
    script = script_of(cfg)
    if script is None:
        raise ValueError(f"config.json of {cfg.get('out')!r} is not a study this audit runs")
    return study_module(script).make_jobs(cfg)


def find_job(cfg: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    """The one job of the study that ``want`` names (workload, load, seed, spec; with a
    ``movement`` and ``kv_capacity_tokens`` for a regime-map run)."""
    jobs = [
        j
        for j in study_jobs(cfg)
        if all(j.get(k) == v for k, v in want.items())
        and ("movement" in want or "movement" not in j)
    ]
    if len(jobs) != 1:
        raise LookupError(f"{cfg.get('out')}: {len(jobs)} jobs match {dict(want)}")
    return jobs[0]


def row_of(rows: Sequence[Mapping[str, str]], job: Mapping[str, Any]) -> Mapping[str, str]:
    """The committed ``runs.csv`` row of ``job``."""
    found = [
        r
        for r in rows
        if r["workload"] == job["workload"]
        and float(r["load"]) == job["load"]
        and int(r["seed"]) == job["seed"]
        and r["policy"] == job["spec"]
        and (r.get("movement") or None) == job.get("movement")
        and float(r.get("prediction_error") or 0.0) == job.get("prediction_error", 0.0)
        and r.get("shadow") == job.get("shadow")
        and (
            "kv_capacity_tokens" not in job
            or int(r["kv_capacity_tokens"]) == job["kv_capacity_tokens"]
        )
    ]
    if len(found) != 1:
        raise LookupError(f"{len(found)} committed rows for {dict(job)}")
    return found[0]


def same(again: float, committed: float) -> bool:
    """Equal to the digits ``runs.csv`` keeps."""
    return abs(again - committed) <= REL_TOL * abs(committed) + 1e-9


def read_rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "runs.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def _pick_key(study: str, job: Mapping[str, Any]) -> str:
    text = study + json.dumps(job, sort_keys=True, default=repr)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def sample(
    study: str, jobs: Sequence[Mapping[str, Any]], per_spec: int, max_load: float, rollout: bool
) -> list[dict[str, Any]]:
    """Up to ``per_spec`` jobs of each spec at loads up to ``max_load``, by a hash of the
    study and the job (the same choice on every call), in the order of ``jobs``."""
    by_spec: dict[str, list[Mapping[str, Any]]] = {}
    for job in jobs:
        if job["load"] <= max_load and (rollout or not job["spec"].startswith("topas-rollout")):
            by_spec.setdefault(job["spec"], []).append(job)
    chosen = {
        id(j)
        for group in by_spec.values()
        for j in sorted(group, key=lambda j: _pick_key(study, j))[:per_spec]
    }
    return [dict(j) for j in jobs if id(j) in chosen]


def audit_jobs(
    folders: Sequence[Path], per_spec: int, max_load: float, rollout: bool
) -> list[dict[str, Any]]:
    """The runs to check: each a study job with the study's name and committed metrics."""
    out = []
    for folder in folders:
        cfg = json.loads((folder / "config.json").read_text())
        if script_of(cfg) is None or not (folder / "runs.csv").exists():
            continue
        study = folder.relative_to(RESULTS).as_posix()
        rows = read_rows(folder)
        for job in sample(study, study_jobs(cfg), per_spec, max_load, rollout):
            out.append(audit_item(study, cfg, rows, job))
    return out


def audit_item(
    study: str, cfg: Mapping[str, Any], rows: Sequence[Mapping[str, str]], job: Mapping[str, Any]
) -> dict[str, Any]:
    """One run to check (:func:`check`): the job, its study and script, and the metrics of
    its committed row."""
    row = row_of(rows, job)
    committed = {f"committed_{m}": float(row[m]) for m in METRICS}
    return {"study": study, "script": script_of(cfg), "job": dict(job), **committed}


def check(item: Mapping[str, Any]) -> dict[str, Any]:
    """Run one audited job again (module level: sent to the workers)."""
    job = item["job"]
    start = time.perf_counter()
    again = runner(item["script"])(job)
    ok = all(same(again[m], item[f"committed_{m}"]) for m in METRICS)
    return {
        "study": item["study"],
        "spec": item.get("as", job["spec"]),
        "pinned": job["spec"],
        "workload": job["workload"],
        "load": job["load"],
        "seed": job["seed"],
        "movement": job.get("movement", ""),
        "kv_capacity_tokens": again.get("kv_capacity_tokens", ""),
        **{f"committed_{m}": item[f"committed_{m}"] for m in METRICS},
        **{m: again[m] for m in METRICS},
        "same": ok,
        "reproduces_as": "",  # filled in by main for a moved spec (:func:`equivalents`)
        "runtime_s": round(time.perf_counter() - start, 3),
    }


def pinned(spec: str, pin: Sequence[str]) -> str | None:
    """``spec`` with the parameters of ``pin`` it does not set itself (None: not a
    ``topas`` or ``topas-base`` spec, or it sets them all)."""
    name, _, params = spec.partition(":")
    if name not in PINNABLE:
        return None
    given = [p for p in params.split(",") if p]
    keys = {p.split("=", 1)[0] for p in given}
    extra = [p for p in pin if p.split("=", 1)[0] not in keys]
    return f"{name}:{','.join([*given, *extra])}" if extra else None


def pin_items(items: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]) -> list:
    """The runs that look for a moved spec's equivalent today: each of its sampled runs
    under each of :data:`PINS` (the original spec kept as ``as``)."""
    moved = {(r["study"], r["spec"]) for r in rows if not r["same"]}
    out = []
    for item in items:
        spec = item["job"]["spec"]
        if (item["study"], spec) not in moved:
            continue
        for pin in PINS:
            other = pinned(spec, pin)
            if other is not None:
                out.append({**item, "job": {**item["job"], "spec": other}, "as": spec})
    return out


def equivalents(pin_rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(study, moved spec) -> the first pinned spec (in the order of :data:`PINS`) that
    gives every sampled run of it."""
    tried: dict[tuple[str, str], dict[str, bool]] = {}
    for r in pin_rows:
        ok = tried.setdefault((r["study"], r["spec"]), {})
        ok[r["pinned"]] = ok.get(r["pinned"], True) and r["same"]
    return {key: next((s for s, good in ok.items() if good), "") for key, ok in tried.items()}


def last_commit(folder: Path) -> str:
    """The commit that last wrote ``folder/runs.csv`` ('' outside a git checkout or
    without git)."""
    try:
        done = subprocess.run(
            ["git", "log", "-1", "--format=%h %cs", "--", str(folder / "runs.csv")],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
    except OSError:
        return ""
    return done.stdout.strip()


def summarize(rows: Sequence[Mapping[str, Any]], command: str, wall_s: float) -> str:
    """Per study: the specs that reproduce, those that moved (one example each)."""
    studies = list(dict.fromkeys(r["study"] for r in rows))
    body = []
    for study in studies:
        mine = [r for r in rows if r["study"] == study]
        specs = sorted({r["spec"] for r in mine})
        moved = {
            s: next((r for r in mine if r["spec"] == s and not r["same"]), None) for s in specs
        }
        kept = [f"`{s}`" for s in specs if moved[s] is None]
        gone = [
            f"`{s}` ({r['workload']} {r['load']:g}{' ' + r['movement'] if r['movement'] else ''}: "
            f"{r['committed_mean_jct']:.2f} -> {r['mean_jct']:.2f} s"
            + (f"; today `{r['reproduces_as']}`)" if r["reproduces_as"] else ")")
            for s, r in moved.items()
            if r is not None
        ]
        body.append(
            [
                f"`{study}`",
                last_commit(RESULTS / study),
                len(mine),
                ", ".join(kept) or "none",
                "; ".join(gone) or "none",
            ]
        )
    n_moved = sum(1 for r in rows if not r["same"])
    stale = sum(1 for b in body if b[4] != "none")
    return "\n".join(
        [
            "# Audit of the committed study runs",
            "",
            f"Command: `{command}`",
            "",
            f"{len(rows)} runs of {len(studies)} studies run again with today's code in "
            f"{wall_s:.0f} s; {n_moved} came out different from the committed run, in "
            f"{stale} of the {len(studies)} studies. A spec 'reproduces' when every sampled "
            "run of it gives the committed mean and p99 JCT; 'moved' gives one run that does "
            "not (committed -> "
            "today's mean JCT), and where a `topas` or `topas-base` spec with a later default "
            "switched back gives every sampled run, that spec ('today'). The commit is the "
            "last one to write the study's runs.csv, whose code made its runs.",
            "",
            md_table(["study", "runs.csv from", "runs checked", "reproduce", "moved"], body),
            "",
        ]
    )


def build_parser() -> ex.Parser:
    ap = ex.Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-spec", default="2", help="runs checked per spec and study (2)")
    ap.add_argument("--max-load", default="1.2", help="only runs at loads up to this (1.2)")
    ap.add_argument("--rollout", action="store_true", help="check topas-rollout specs too")
    ap.add_argument("--studies", default=None, help="comma-separated folders under docs/results")
    ap.add_argument("--jobs", default=None, help="parallel processes (default: CPU count)")
    ap.add_argument("--out", default="docs/results/audit", help="output folder")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def folders_of(text: str | None) -> list[Path]:
    """The study folders asked for (default: every one with a config.json)."""
    if text is None:
        return sorted(p.parent for p in RESULTS.glob("**/config.json"))
    out = []
    for name in dict.fromkeys(p.strip() for p in text.split(",") if p.strip()):
        folder = RESULTS / name
        if not (folder / "config.json").is_file():
            raise ex.CliError(f"--studies: no study at docs/results/{name}")
        out.append(folder)
    return out


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    per_spec = ex.parse_positive_int(args.per_spec, "--per-spec")
    max_load = ex.parse_positive_float(args.max_load, "--max-load")
    folders = folders_of(args.studies)
    out = ex.check_out(args.out)
    n_jobs = ex.parse_jobs(args.jobs)
    items = audit_jobs(folders, per_spec, max_load, args.rollout)
    start = time.perf_counter()
    rows = run_jobs(check, items, n_jobs, not args.no_progress, desc="audit")
    pins = run_jobs(check, pin_items(items, rows), n_jobs, not args.no_progress, desc="pins")
    found = equivalents(pins)
    rows = [
        {**r, "reproduces_as": "" if r["same"] else found.get((r["study"], r["spec"]), "")}
        for r in rows
    ]
    wall_s = time.perf_counter() - start
    command = shlex.join(["python", "analysis/audit_results.py", *argv])
    summary = summarize(rows, command, wall_s)
    params = {
        "per_spec": per_spec,
        "max_load": max_load,
        "rollout": args.rollout,
        "studies": [f.relative_to(RESULTS).as_posix() for f in folders],
        "runs": len(rows),
        "pinned_runs": len(pins),
        "wall_s": round(wall_s, 3),
    }
    write_outputs(
        out, study_files("audit of committed runs", params, command, rows, summary, COLUMNS)
    )
    print(summary, end="")
    return 0


if __name__ == "__main__":
    sys.exit(ex.run_cli(main))
