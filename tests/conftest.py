"""Shared test helpers: compact instance builders, a hypothesis strategy, and a loader
for the scripts of ``analysis/``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from topas.instance import Instance

settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"


def load_analysis(name: str):  # type: ignore[no-untyped-def]
    """The script ``analysis/<name>.py`` as a fresh module (the scripts are not a package),
    loaded as running it would: with ``analysis/`` on ``sys.path`` (the scripts import
    one another) and the module registered under its name (dataclasses and pickle look a
    class's module up by name)."""
    if str(ANALYSIS) not in sys.path:
        sys.path.insert(0, str(ANALYSIS))
    spec = importlib.util.spec_from_file_location(name, ANALYSIS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def stage(sid: str, agent: str, inp: int, out: int, deps=(), pred: int | None = None) -> dict:
    d: dict[str, Any] = {
        "id": sid,
        "agent": agent,
        "input_tokens": inp,
        "output_tokens": out,
        "deps": list(deps),
    }
    if pred is not None:
        d["predicted_output_tokens"] = pred
    return d


def kv_of(inst: Instance):
    """Input plus output of the stage (what the step engine commits), as a ``kv_need``."""
    return lambda ref, gen: inst.stage(ref).input_tokens + inst.stage(ref).output_tokens


def task(tid: str, arrival: float, *stages: dict) -> dict:
    return {"id": tid, "arrival": arrival, "stages": list(stages)}


def make(
    agents: dict[str, int],
    tasks: list[dict],
    capacity: int,
    chunk: int = 10,
    max_running: int | None = None,
    cost: dict | None = None,
    load: dict | None = None,
    **server: Any,
) -> Instance:
    """An instance from compact parts; the step model with step_s=1 unless ``cost`` says."""
    srv: dict[str, Any] = {
        "kv_capacity_tokens": capacity,
        "chunk_tokens": chunk,
        "cost_model": cost or {"kind": "step", "step_s": 1.0},
        **server,
    }
    if max_running is not None:
        srv["max_running"] = max_running
    if load is not None:
        srv["prefix_load"] = load
    return Instance.from_dict(
        {
            "format": "topas-instance/1",
            "name": "test",
            "server": srv,
            "agents": [{"id": a, "prefix_tokens": p} for a, p in agents.items()],
            "tasks": tasks,
        }
    )


def jcts_across_processes(tmp_path, inst: Instance, spec: str, hash_seeds=("1", "2")):
    """The per-task JCTs of ``topas simulate INSTANCE --policy SPEC`` run in a fresh process
    per ``PYTHONHASHSEED``: string hashing, so the order of a set of names, differs between
    them, and no decision may depend on it."""
    import json
    import subprocess
    import sys

    from topas.instance import save_instance

    inst_file = tmp_path / "i.json"
    save_instance(inst, inst_file)
    docs = []
    for hash_seed in hash_seeds:
        out = tmp_path / f"r{hash_seed}.json"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        cmd = [sys.executable, "-m", "topas.cli", "simulate", str(inst_file), "--policy", spec]
        run = subprocess.run(
            [*cmd, "--out", str(out), "--no-progress"],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        docs.append(json.loads(out.read_text())["jct"])
    return docs


@st.composite
def random_instances(
    draw,
    max_tasks: int = 4,
    max_stages: int = 5,
    host: bool | None = None,
    predictions: bool = True,
) -> Instance:
    """Small random instances: random DAGs, tight KV budgets, random predictions."""
    n_agents = draw(st.integers(1, 3))
    chunk = draw(st.sampled_from([4, 8, 16]))
    prefixes = {f"a{i}": draw(st.integers(1, 40)) for i in range(n_agents)}
    tasks = []
    biggest = max(prefixes.values())
    for j in range(draw(st.integers(1, max_tasks))):
        n = draw(st.integers(1, max_stages))
        stages = []
        for k in range(n):
            deps = [f"s{d}" for d in range(k) if draw(st.booleans())] if k else []
            agent = f"a{draw(st.integers(0, n_agents - 1))}"
            inp, out = draw(st.integers(1, 20)), draw(st.integers(1, 8))
            pred = draw(st.one_of(st.none(), st.integers(1, 12))) if predictions else None
            stages.append(stage(f"s{k}", agent, inp, out, deps, pred))
            biggest = max(biggest, prefixes[agent] + inp + out)
        arrival = (
            draw(st.integers(0, 12))
            if draw(st.booleans())
            else draw(st.floats(0, 12, allow_nan=False))
        )
        tasks.append(task(f"t{j}", arrival, *stages))
    capacity = biggest + draw(st.integers(0, 80))
    use_host = draw(st.booleans()) if host is None else host
    load = (
        {"kind": "host", "tokens_per_s": draw(st.sampled_from([5.0, 20.0, 1000.0]))}
        if use_host
        else None
    )
    max_running = draw(st.one_of(st.none(), st.integers(1, 3)))
    cost = {
        "kind": "linear",
        "base_s": 1.0,
        "prefill_token_s": 0.01,
        "decode_seq_s": 0.05,
        "kv_token_s": 0.001,
    }
    return make(
        prefixes,
        tasks,
        capacity,
        chunk=chunk,
        max_running=max_running,
        cost=cost,
        load=load,
        mixed_chunk=draw(st.booleans()),
    )
