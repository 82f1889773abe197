"""The study framework: a frozen config, a parallel runner, and one way to write results.

Every study (compare, ablation, starvation, the paper reproduction, the optimality gap)
is the same shape: a configuration, validated before anything runs; a list of jobs run on
worker processes (:func:`run_jobs`, joblib, with a progress bar); rows rendered as
``runs.csv`` (:func:`rows_to_csv`) and a ``summary.md`` (:func:`md_table`); and a
``config.json`` (:func:`config_document`) that records the configuration, the command,
the versions and the date. :func:`write_outputs` writes the folder's files atomically
once every one of them has been rendered, so a failure leaves no half-written study.
A long study can keep its finished runs in a :class:`~topas.studies.checkpoint.Checkpoint`
as they arrive, so that an interrupted run resumes where it stopped.

:class:`StudyConfig` is the base of frozen study configurations: ``to_json`` and
``from_json`` round-trip them (tuples come back as tuples), and ``validate`` is called on
construction. :class:`StudyParams` freezes a study's named parameters the same way where
the configuration is a set of values validated by the study's own command line. Plots
are rendered outside the library (``analysis/``, or beside the study) and handed in as
bytes.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from topas.errors import InputError
from topas.instance import write_atomic
from topas.studies.checkpoint import Checkpoint, job_key

J = TypeVar("J")
R = TypeVar("R")
C = TypeVar("C", bound="StudyConfig")

EXCLUDED_POLICIES = ("replay",)
"""Registered policies a study never runs on generated instances (``replay`` replays one
recorded schedule)."""


# --------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class StudyConfig:
    """Base of a study's frozen configuration: subclasses add fields and ``validate``."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`~topas.errors.InputError` naming the first bad field."""

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON values (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_json(cls: type[C], data: Mapping[str, Any]) -> C:
        """The config of ``to_json`` output: lists become the tuples the fields hold.
        Unknown keys are refused with the list of fields."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise InputError(
                f"{cls.__name__}: unknown field(s) {', '.join(unknown)} "
                f"(fields: {', '.join(fields)})"
            )
        hints = typing.get_type_hints(cls)
        return cls(**{k: _from_json(v, hints[k]) for k, v in data.items()})


def _from_json(value: Any, hint: Any) -> Any:
    """``value`` as a field of type ``hint`` holds it: a list as a tuple where the field
    is a tuple (alone or in a union with None)."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if isinstance(value, list) and any(typing.get_origin(o) is tuple for o in options):
        return tuple(value)
    return value


class StudyParams(Mapping[str, Any]):
    """A study's parameters as a read-only mapping, for studies whose configuration is a
    set of named values (the simulation studies): frozen once validated, every sequence a
    tuple and every mapping a StudyParams, so that a configuration and its JSON round trip
    (``to_json``, ``from_json``) compare equal."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = {str(k): _frozen(v) for k, v in data.items()}

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"StudyParams({self._data!r})"

    def to_json(self) -> dict[str, Any]:
        """The values as JSON values (tuples become lists, nested params dicts)."""
        return {k: _thawed(v) for k, v in self._data.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StudyParams:
        return cls(data)


def _frozen(v: Any) -> Any:
    if isinstance(v, Mapping):
        return v if isinstance(v, StudyParams) else StudyParams(v)
    if isinstance(v, list | tuple):
        return tuple(_frozen(x) for x in v)
    return v


def _thawed(v: Any) -> Any:
    if isinstance(v, StudyParams):
        return v.to_json()
    if isinstance(v, tuple):
        return [_thawed(x) for x in v]
    return v


# --------------------------------------------------------------------------- running


def _indexed(fn: Callable[[J], R], index: int, job: J) -> tuple[int, R]:
    return index, fn(job)


def run_jobs(
    fn: Callable[[J], R],
    jobs: Sequence[J],
    n_jobs: int,
    progress: bool = True,
    desc: str = "runs",
    unit: str = "run",
    checkpoint: Checkpoint | None = None,
) -> list[R]:
    """``fn(job)`` for every job on ``n_jobs`` worker processes (joblib; -1: every core),
    in the order of ``jobs``. Results arrive in completion order, so the progress bar (on
    stderr) advances as runs finish. ``fn`` must be a module-level function (it is sent
    to the workers by reference).

    With a ``checkpoint``, each result is appended to it as it arrives, and a job whose
    result the checkpoint already holds (same :func:`~topas.studies.checkpoint.job_key`)
    is not run again: its stored result is returned (``checkpoint.resumed`` counts them)."""
    from joblib import Parallel, delayed

    keys = [job_key(job) for job in jobs]
    done = checkpoint.load() if checkpoint is not None else {}
    out: list[Any] = [done.get(k, _MISSING) for k in keys]
    todo = [i for i, r in enumerate(out) if r is _MISSING]
    if checkpoint is not None:
        checkpoint.resumed = len(jobs) - len(todo)
    tasks = (delayed(_indexed)(fn, i, jobs[i]) for i in todo)
    results: Iterable[tuple[int, R]] = Parallel(n_jobs=n_jobs, return_as="generator_unordered")(
        tasks
    )
    if progress:
        from tqdm import tqdm

        results = tqdm(
            results,
            total=len(jobs),
            initial=len(jobs) - len(todo),
            desc=desc,
            unit=unit,
            file=sys.stderr,
        )
    for i, r in results:
        out[i] = r
        if checkpoint is not None:
            checkpoint.append(keys[i], r)
    assert all(r is not _MISSING for r in out)
    return out


_MISSING = object()


# --------------------------------------------------------------------------- writing


def cell(v: Any) -> Any:
    """A CSV cell: None and non-finite floats empty, bools ``true``/``false``, floats with
    10 significant digits."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.10g}" if math.isfinite(v) else ""
    return v


def rows_to_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = ()) -> str:
    """CSV text: the ``columns`` present in the rows first, then any other keys in
    first-seen order."""
    keys = [c for c in columns if any(c in r for r in rows)]
    for r in rows:
        keys += [k for k in r if k not in keys]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(keys)
    for r in rows:
        w.writerow([cell(r.get(k)) for k in keys])
    return buf.getvalue()


def md_table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def config_document(study: str, params: Mapping[str, Any], command: str) -> dict[str, Any]:
    """config.json: the study, every parameter, the command, the versions and the date."""
    from topas.results import package_version

    return {
        "study": study,
        **params,
        "command": command,
        "topas_version": package_version(),
        "python": sys.version.split()[0],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_outputs(out: Path, files: Mapping[str, str | bytes]) -> None:
    """Create ``out`` if needed and write every file atomically. Callers render all the
    content first, so an error while rendering leaves the folder as it was."""
    if out.exists() and not out.is_dir():
        raise InputError(f"out: {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_atomic(out / name, data)


def config_json(study: str, params: Mapping[str, Any], command: str) -> str:
    """:func:`config_document` as the text of config.json."""
    return json.dumps(config_document(study, params, command), indent=1) + "\n"


def study_files(
    study: str,
    params: Mapping[str, Any],
    command: str,
    rows: Sequence[Mapping[str, Any]],
    summary: str,
    columns: Sequence[str] = (),
) -> dict[str, str | bytes]:
    """The files every study writes (config.json, runs.csv, summary.md), rendered, for
    :func:`write_outputs`; a study adds its plots to the mapping."""
    return {
        "config.json": config_json(study, params, command),
        "runs.csv": rows_to_csv(rows, columns),
        "summary.md": summary,
    }


# --------------------------------------------------------------------------- policies


def default_policies() -> tuple[str, ...]:
    """Every registered policy (and entry point) except :data:`EXCLUDED_POLICIES`."""
    from topas.policies import available

    return tuple(p for p in available() if p not in EXCLUDED_POLICIES)
