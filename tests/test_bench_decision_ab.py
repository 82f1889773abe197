"""analysis/bench_decision_ab.py: two versions of the code timed side by side in one process,
and whether they made the same decisions."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_analysis

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "analysis" / "bench_decision_ab.py"
ab = load_analysis("bench_decision_ab")
SMALL = ["--agents", "8", "--waiting", "100", "--decisions", "30", "--warmup", "2"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    for part in ("topas", "analysis"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def test_a_copy_of_this_tree_makes_the_same_decisions(tmp_path) -> None:
    proc = _run("--base", str(_copy(tmp_path)), *SMALL)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith("topas, 8 agents, 100 waiting, 30 pairs: base (")
    assert "new/base per pair: median " in line and line.endswith("; the same decisions")


def test_a_change_of_decisions_is_reported(tmp_path) -> None:
    # the base ages tasks ten times faster (H_age a tenth): its pack order, and so its
    # decisions, differ; the run says so and exits 1
    tree = _copy(tmp_path)
    search = tree / "topas" / "policies" / "search.py"
    text = search.read_text()
    assert "\nAGE_FRACTION = 0.5\n" in text
    search.write_text(text.replace("\nAGE_FRACTION = 0.5\n", "\nAGE_FRACTION = 0.05\n"))
    proc = _run("--base", str(tree), *SMALL)
    assert proc.returncode == 1, proc.stderr
    assert "DIFFERENT decisions (from timed decision" in proc.stdout


def test_each_side_runs_its_own_code(tmp_path) -> None:
    # the base's TOPAS is the copy's (its source file), the new one this checkout's
    import topas.errors

    tree = _copy(tmp_path)
    with ab.isolated():
        base = ab.make_side(tree, "topas", 8, 10, 0)
        new = ab.make_side(ROOT, "topas", 8, 10, 0)
        res = ab.race(base, new, decisions=4, warmup=1)
    assert type(base.policy) is not type(new.policy)
    assert ab.source_of(base.policy).startswith(str(tree))
    assert ab.source_of(new.policy).startswith(str(ROOT / "topas"))
    assert res.differs_at is None and len(res.ratios) == 4
    # the caller's modules are its own again: the classes its code names are the same
    assert sys.modules["topas.errors"] is topas.errors


def test_a_policy_that_imports_while_deciding_is_refused(tmp_path) -> None:
    # such an import would find no tree of its own on the path (each side's modules are
    # forgotten once built) and read the installed package: not what the side runs
    tree = _copy(tmp_path)
    search = tree / "topas" / "policies" / "search.py"
    text = search.read_text()
    at = "        rnd = self._round(state)\n"
    assert text.count(at) == 1
    search.write_text(text.replace(at, "        import topas.forward  # noqa: F401\n" + at))
    proc = _run("--base", str(tree), *SMALL)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: the policy imports modules while deciding (")
    assert proc.stderr.endswith(" first): not comparable here\n") and "topas" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--base", "no-such-revision"], "--base no-such-revision: not a directory nor"),
        (["--base", "."], ": not a source tree (no topas)"),
        (["--base", str(ROOT), "--decisions", "0"], "--decisions: must be a positive integer"),
        (["--base", str(ROOT), "--policy", "nosuch"], "--policy nosuch: unknown policy"),
        (["--base", str(ROOT), "--new", "/no/such/dir"], "--new /no/such/dir: not a directory"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, message) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert message in proc.stderr


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
def test_a_revision_is_checked_out_for_the_run_and_removed() -> None:
    with ab.checkout("HEAD") as tree:
        assert (tree / "topas" / "policies" / "search.py").exists()
        assert (tree / "analysis" / "bench_decision.py").exists()
    assert not tree.exists()
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True
    ).stdout
    assert str(tree) not in listed
