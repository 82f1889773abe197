"""Replay a ``topas-instance/1`` workload against a running SGLang server.

Every stage becomes one native ``/generate`` request of token ids (the server runs with
``--skip-tokenizer-init``): its agent's system prompt, a fixed token sequence of
``prefix_tokens`` ids per agent, followed by fresh input ids; ``max_new_tokens`` is the
stage's true output length with ``ignore_eos``, so the server decodes exactly that many
tokens. The request carries the stage's workflow metadata (:mod:`topas.workflow_metadata`)
in ``sampling_params.custom_params``, which the TOPAS plugin reads and SGLang's own
policies ignore.

Tasks are released at their arrival times (seconds after the start); a stage is sent as
soon as its dependencies have returned; everything in flight runs concurrently. The
measured times become a :class:`~topas.schedule.Schedule` with timing ``"live"`` (admit and
start: when the request was sent; end: when its response arrived; prefix hit: the server
reported at least the prefix as cached), so :func:`~topas.schedule.evaluate` and the
result file are the same as for a simulated run.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from topas.instance import Instance, Task
from topas.results import result_document
from topas.schedule import Metrics, Schedule, StageRun, evaluate
from topas.workflow_metadata import encode

TOKEN_LOW, TOKEN_HIGH = 1000, 120_000
"""Token ids are drawn from this range: inside Llama-3's vocabulary, clear of the special
tokens at its start and end."""

LIVE = "live"


class ServeBenchError(RuntimeError):
    """The server could not be reached or answered with an error."""


def prefix_ids(instance: Instance, seed: int = 0) -> dict[str, list[int]]:
    """One fixed token sequence per agent: its system prompt."""
    out = {}
    for i, agent in enumerate(instance.agents):
        rng = np.random.default_rng([seed, 1, i])
        out[agent.id] = rng.integers(TOKEN_LOW, TOKEN_HIGH, agent.prefix_tokens).tolist()
    return out


def stage_payload(
    instance: Instance, task: Task, stage: str, prefixes: dict[str, list[int]], seed: int = 0
) -> dict[str, Any]:
    """The ``/generate`` body of one stage (a ``GenerateReqInput``). ``routing_key`` is the
    task id, so a router in front of several workers can keep a task's stages, and its
    agents' prompts, on one worker."""
    t = instance.tasks.index(task)
    s = task.stage_by_id[stage]
    rng = np.random.default_rng([seed, 2, t, task.stages.index(s)])
    fresh = rng.integers(TOKEN_LOW, TOKEN_HIGH, s.input_tokens).tolist()
    prefix = prefixes[s.agent]
    return {
        "rid": f"{task.id}/{stage}",
        "routing_key": task.id,
        "input_ids": prefix + fresh,
        "sampling_params": {
            "max_new_tokens": s.output_tokens,
            "ignore_eos": True,
            "custom_params": encode(
                task,
                stage,
                len(prefix),
                arrival=task.arrival,
                prefixes={a: len(ids) for a, ids in prefixes.items()},
            ),
        },
    }


ROUTING_KEY_HEADER = "x-smg-routing-key"
"""The header SGLang's router (the ``smg`` package) routes by (its ``--routing-key-headers``
default); SGLang's OpenAI routes read the same header. The router ignores the body's
``routing_key``, which a worker reads."""


def post_json(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """POST ``body`` as JSON and return the decoded JSON answer; ServeBenchError otherwise."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if body.get("routing_key"):  # SGLang's router (smg) keys on the header, not the body
        headers[ROUTING_KEY_HEADER] = str(body["routing_key"])
    request = urllib.request.Request(url, data, headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise ServeBenchError(f"{url}: HTTP {e.code} for request {body.get('rid')!r}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ServeBenchError(f"{url}: {reason}") from None
    except ValueError:
        raise ServeBenchError(f"{url}: the answer to {body.get('rid')!r} is not JSON") from None


def replay(
    instance: Instance,
    base_url: str,
    seed: int = 0,
    timeout: float = 600.0,
    post: Callable[[str, dict[str, Any], float], dict[str, Any]] = post_json,
) -> Schedule:
    """Run the workload against ``base_url`` (e.g. ``http://127.0.0.1:30000``)."""
    return asyncio.run(_replay(instance, base_url.rstrip("/") + "/generate", seed, timeout, post))


async def _replay(instance, url, seed, timeout, post) -> Schedule:  # type: ignore[no-untyped-def]
    prefixes = prefix_ids(instance, seed)
    schedule = Schedule(instance=instance, timing=LIVE)
    loop = asyncio.get_running_loop()
    workers = max(4, instance.num_stages)
    t0 = time.perf_counter()

    def now() -> float:
        return time.perf_counter() - t0

    async def run_stage(task: Task, sid: str, done: dict[str, asyncio.Event]) -> None:
        for dep in task.stage_by_id[sid].deps:
            await done[dep].wait()
        body = stage_payload(instance, task, sid, prefixes, seed)
        sent = now()
        answer = await loop.run_in_executor(pool, post, url, body, timeout)
        cached = (answer.get("meta_info") or {}).get("cached_tokens", 0)
        prefix = instance.agent_by_id[task.stage_by_id[sid].agent].prefix_tokens
        schedule.runs.append(
            StageRun(task.id, sid, task.stage_by_id[sid].agent, sent, sent, now(), False,
                     cached >= prefix)
        )  # fmt: skip
        done[sid].set()

    async def run_task(task: Task) -> None:
        await asyncio.sleep(max(0.0, task.arrival - now()))
        done = {s.id: asyncio.Event() for s in task.stages}
        await asyncio.gather(*(run_stage(task, s.id, done) for s in task.stages))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        await asyncio.gather(*(run_task(t) for t in instance.tasks))
    return schedule


def run_live(
    instance: Instance, base_url: str, label: str, seed: int = 0, timeout: float = 600.0
) -> tuple[Metrics, dict[str, Any]]:
    """:func:`replay` the workload, then its metrics and its ``topas-result/1`` document
    (timing ``live``, policy ``label``): what ``topas serve-bench`` writes."""
    t0 = time.perf_counter()
    schedule = replay(instance, base_url, seed=seed, timeout=timeout)
    metrics = evaluate(schedule)
    doc = result_document(instance, schedule, metrics, label, seed, LIVE, time.perf_counter() - t0)
    return metrics, doc
