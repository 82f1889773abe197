"""Many workers: SGLang's router (``smg``) keeps every stage of a task on one worker.

Two real fake-model SGLang servers with the TOPAS plugin, each emitting its own token
(``TOPAS_FAKE_TOKEN``), so that every answer says which worker decoded it, behind the real
router with a keyed policy. ``serve_bench.replay`` sends the requests through its
``post_json``, which must put the task id in the ``x-smg-routing-key`` header (the router
ignores the body's ``routing_key``). The workload is fan-out: each task keeps up to six
stages in flight at once. Checked, for each keyed policy:

- every stage of a task was decoded by one worker;
- both workers served tasks (otherwise the first check says nothing);
- every task finished, with all its output tokens;
- the plugin on each worker planned with the stages' workflow metadata, so that metadata
  crossed the router intact (counted since the workers started).

Skipped without SGLang or the router (``pip install smg``). Takes about 80 s on two cores,
most of it the two servers' start-up.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import pytest

pytest.importorskip("smg.launch_router", reason="the router is not installed (pip install smg)")

from topas import serve_bench  # noqa: E402
from topas.instance import Instance  # noqa: E402
from topas.schedule import evaluate  # noqa: E402
from topas.serve_bench import ROUTING_KEY_HEADER  # noqa: E402
from topas.workloads import generate  # noqa: E402
from topas_sglang.controller import stats_from_log  # noqa: E402
from topas_sglang.fake_server import FakeServer  # noqa: E402
from topas_sglang.router import Router  # noqa: E402

TOKENS = (11, 22)
"""The token each worker emits: not the fake model's default (7), nor its config's bos (1)
or eos (2)."""

TASKS = 12
"""Enough tasks that ``consistent_hashing`` (the ring depends on the workers' random ports)
puts them all on one worker only with probability 2**-11."""


@dataclass
class TokenServer(FakeServer):
    """A fake-model server whose every output token is ``token``."""

    token: int = 7

    def environment(self) -> dict[str, str]:
        return {**super().environment(), "TOPAS_FAKE_TOKEN": str(self.token)}


def fanout(prefix: str) -> Instance:
    """Fan-out tasks (plan, six parallel maps, reduce) whose ids start with ``prefix``, so
    that each router policy sees keys that no earlier run has pinned."""
    inst = generate("fanout", num_tasks=TASKS, seed=0, load=1.0, token_scale=16)
    return replace(inst, tasks=tuple(replace(t, id=f"{prefix}-{t.id}") for t in inst.tasks))


def start_all(servers: list[TokenServer]) -> None:
    """Start the servers side by side (each takes 20-40 s); the first failure is raised
    once all have returned, and the caller stops them all."""
    with ThreadPoolExecutor(len(servers)) as pool:
        for future in [pool.submit(s.start) for s in servers]:
            future.result()


@pytest.fixture(scope="module")
def workers(tmp_path_factory):  # type: ignore[no-untyped-def]
    """Two fake-model servers with the TOPAS plugin, one token each, stopped at the end
    even if a start fails."""
    logs = tmp_path_factory.mktemp("workers")
    kv = fanout("kv").server.kv_capacity_tokens
    servers = [
        TokenServer(port=0, max_total_tokens=kv, token=t, log_path=logs / f"worker-{t}.log")
        for t in TOKENS
    ]
    try:
        start_all(servers)
        yield servers
    finally:
        for s in servers:
            s.stop()


class Recorder:
    """``serve_bench.post_json`` that also keeps each answer's ``output_ids``, per rid."""

    def __init__(self) -> None:
        self.output_ids: dict[str, list[int]] = {}

    def __call__(self, url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        answer = serve_bench.post_json(url, body, timeout)
        self.output_ids[body["rid"]] = list(answer.get("output_ids") or [])
        return answer


def worker_tokens(inst: Instance, output_ids: dict[str, list[int]]) -> dict[str, set[int]]:
    """The tokens each task's stages came back with (one token: one worker), after checking
    that every stage returned all of its output tokens."""
    seen: dict[str, set[int]] = defaultdict(set)
    for task in inst.tasks:
        for stage in task.stages:
            ids = output_ids.get(f"{task.id}/{stage.id}")
            assert ids is not None, f"no answer for {task.id}/{stage.id}"
            assert len(ids) == stage.output_tokens, f"{task.id}/{stage.id}: {len(ids)} tokens"
            seen[task.id] |= set(ids)
    return seen


POLICIES = {
    "consistent_hashing": (),
    "manual": ("--assignment-mode", "min_group"),  # a new task: fewest tasks in flight
}
"""The router's keyed policies, with their options."""


@pytest.mark.parametrize("policy", list(POLICIES))
def test_router_keeps_each_task_on_one_worker(workers, policy, tmp_path):  # type: ignore[no-untyped-def]
    inst = fanout(policy)
    recorder = Recorder()
    with Router(
        worker_urls=[s.url for s in workers],
        policy=policy,
        # stop in about 1 s instead of the default's 5 s settle window
        extra_args=(*POLICIES[policy], "--shutdown-grace-period-secs", "2"),
        log_path=tmp_path / "router.log",
    ) as router:
        schedule = serve_bench.replay(inst, router.url, timeout=120, post=recorder)
    metrics = evaluate(schedule)  # raises unless every stage finished exactly once
    assert sorted(metrics.jct) == sorted(t.id for t in inst.tasks)
    tokens = worker_tokens(inst, recorder.output_ids)
    split = {task: sorted(ids) for task, ids in tokens.items() if len(ids) != 1}
    assert not split, (
        f"stages of a task reached several workers (does post_json send the "
        f"{ROUTING_KEY_HEADER} header?): tokens per task {split}"
    )
    used = {next(iter(ids)) for ids in tokens.values()}
    assert used == set(TOKENS), f"only workers emitting {sorted(used)} served tasks"
    for server in workers:
        stats = stats_from_log(server.log_path.read_text(errors="replace"))
        assert stats.get("rounds", 0) > 0, f"worker {server.token}: no planned round"
        assert stats["malformed"] == 0 and stats["fallbacks"] == 0, stats
