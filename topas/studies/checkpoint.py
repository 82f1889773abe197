"""A study's finished runs, kept on disk as they finish, so an interrupted study resumes.

A study writes its folder only once every run has finished (:func:`topas.studies.write_outputs`),
so a run stopped after hours used to lose everything. With a :class:`Checkpoint`,
:func:`topas.studies.run_jobs` appends each result to ``<out>/.checkpoint.pkl`` the moment
it arrives (one pickle record per run, flushed and synced), and on a resumed run skips
every job whose result is already there. The study deletes the file once its outputs are
written.

A job is identified by :func:`job_key`, its canonical JSON text (dict keys sorted), so a
resumed study reuses a run only for the very same job; runs of jobs the new study does
not have are ignored. The code is not part of the key: resume with the code that wrote
the checkpoint. A record cut short by a kill mid-write is dropped, and the file truncated
before it, when the checkpoint is opened for resuming.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from topas.errors import InputError

CHECKPOINT_NAME = ".checkpoint.pkl"
"""The checkpoint's file name inside a study's output folder (hidden, git-ignored)."""

RESUME_FLAG = "--resume"
"""The command-line flag of every study that keeps a checkpoint."""


def add_resume_option(parser: argparse.ArgumentParser, what: str = "runs") -> None:
    """A study's ``--resume`` flag (``what``: the study's unit of work, for the help)."""
    parser.add_argument(
        RESUME_FLAG,
        action="store_true",
        help=f"reuse the finished {what} an interrupted run of this study kept in --out",
    )


def replayable(argv: Sequence[str]) -> list[str]:
    """``argv`` as a study records it: ``--resume`` says how it ran, not what it is."""
    return [a for a in argv if a != RESUME_FLAG]


def job_key(job: Any) -> str:
    """A job's identity: canonical JSON (sorted keys; tuples as lists; anything JSON
    cannot hold by its ``repr``)."""
    return json.dumps(job, sort_keys=True, default=repr, separators=(",", ":"))


class Checkpoint:
    """The results of finished jobs in one append-only file: ``{job_key: result}``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.resumed = 0
        """How many of the last :func:`~topas.studies.run_jobs` call's results came from
        the file rather than from a run."""

    @classmethod
    def open(cls, out: Path, resume: bool) -> Checkpoint:
        """The checkpoint of the study folder ``out``. Refuses (InputError) to start over
        a checkpoint that is there unless ``resume``: deleting hours of runs must be a
        choice. Nothing is created until the first result is appended."""
        checkpoint = cls(Path(out) / CHECKPOINT_NAME)
        if checkpoint.path.exists() and not resume:
            n = len(checkpoint.load(repair=False))  # a refusal leaves the file as it is
            raise InputError(
                f"{checkpoint.path}: holds {n} finished run(s) of an interrupted study; "
                "pass --resume to continue it, or delete the file to start over"
            )
        return checkpoint

    def load(self, repair: bool = True) -> dict[Hashable, Any]:
        """Every complete record; a trailing record cut short is dropped (and, with
        ``repair``, truncated away, so that records appended after it can be read back)."""
        records: dict[Hashable, Any] = {}
        if not self.path.exists():
            return records
        with self.path.open("rb+" if repair else "rb") as f:
            good = 0
            while True:
                try:
                    key, result = pickle.load(f)
                except (EOFError, pickle.UnpicklingError, ValueError, TypeError):
                    break
                records[key] = result
                good = f.tell()
            if repair and good != os.fstat(f.fileno()).st_size:
                f.truncate(good)
        return records

    def append(self, key: str, result: Any) -> None:
        """Add one finished job's result, durably (flushed and synced) before returning."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as f:
            pickle.dump((key, result), f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())

    def note(self, total: int, unit: str = "runs") -> str:
        """The summary's paragraph on the runs the last call reused ("" when none)."""
        if not self.resumed:
            return ""
        return (
            f"\n{self.resumed} of the {total} {unit} were reused from the checkpoint in the "
            "output folder (`--resume`: the runs an interrupted run kept, or runs carried "
            "over that the code in use would repeat); the wall-clock time counts this run "
            "only, and each run's own times are those it was run with.\n"
        )

    def params(self, unit: str = "runs") -> dict[str, int]:
        """The config.json entry on the runs the last call reused ({} when none)."""
        return {f"resumed_{unit}": self.resumed} if self.resumed else {}

    def remove(self) -> None:
        """Delete the file (the study's outputs are written)."""
        self.path.unlink(missing_ok=True)
