"""Run the real SGLang 0.5.23 server on the CPU with only the model replaced.

``python -m sglang.launch_server`` with the fake causal LM of
:mod:`topas_sglang.fake_model` (``SGLANG_EXTERNAL_MODEL_PACKAGE``), ``--device cpu
--attention-backend torch_native --disable-cuda-graph --skip-tokenizer-init
--load-format dummy`` and ``--max-total-tokens`` set to the workload's KV budget:
SGLang's HTTP server, scheduler event loops (normal and overlap), radix cache,
``PrefillAdder``, ``retract_decode`` and chunked prefill (at SGLang's default chunk) are
all its own. Nothing inside SGLang is patched.

``policy``: ``"topas"`` (any TOPAS policy spec: ``--radix-eviction-policy topas`` with the
spec in ``--radix-eviction-policy-config``) or one of SGLang's own eviction policies
(``"lru"``) beside ``schedule_policy`` (``"lpm"`` by default). Every server runs SGLang's
Python radix-tree core (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python``), which TOPAS
needs, so that the cache's implementation does not confound a comparison.

    with FakeServer(port=31000, max_total_tokens=20000, policy="topas") as server:
        ...  # server.url

Start-up takes 20-40 s on two cores; starting, stopping and the log are
:class:`topas_sglang.service.Service`'s.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from topas_sglang.fake_model import MODEL_DIR
from topas_sglang.service import Service, ServiceError

SGLANG_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority")
"""SGLang 0.5.23's own eviction policies (``--radix-eviction-policy``)."""


class FakeServerError(ServiceError):
    """The server did not start (its log's tail is in the message) or died."""


@dataclass(kw_only=True)
class FakeServer(Service):
    """One fake-model SGLang server (module docstring)."""

    max_total_tokens: int
    policy: str = "topas"  # a TOPAS spec ("topas", "topas-greedy:aging=0") or an SGLang policy
    schedule_policy: str = "lpm"
    overlap: bool = True  # SGLang's overlap scheduler (event_loop_overlap); off: event_loop_normal
    profile: str = "llama-3-8b/h100"  # TOPAS_FAKE_PROFILE: the iteration-time model
    time_scale: float = 1.0  # TOPAS_FAKE_TIME_SCALE
    noise: float = 0.0  # TOPAS_FAKE_NOISE
    seed: int = 0
    offload: bool = False  # TOPAS plans in a planner process (topas_sglang.offload; the
    # plugin's default), or in the scheduler (False); passed to the server either way
    extra_args: tuple[str, ...] = ()

    error = FakeServerError
    name = "fake-sglang"

    def command(self) -> list[str]:
        """The ``sglang.launch_server`` command line."""
        cmd = [
            self.python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(MODEL_DIR),
            "--device",
            "cpu",
            "--attention-backend",
            "torch_native",
            "--disable-cuda-graph",
            "--skip-tokenizer-init",
            "--load-format",
            "dummy",
            "--max-total-tokens",
            str(self.max_total_tokens),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--schedule-policy",
            self.schedule_policy,
        ]
        if self.policy.partition(":")[0] in SGLANG_POLICIES:
            cmd += ["--radix-eviction-policy", self.policy]
        else:
            cmd += ["--radix-eviction-policy", "topas"]
            config = {"policy": self.policy, "offload": self.offload}
            cmd += ["--radix-eviction-policy-config", json.dumps(config)]
        if not self.overlap:
            cmd.append("--disable-overlap-schedule")
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env.update(
            SGLANG_EXTERNAL_MODEL_PACKAGE="topas_sglang.fake_model",
            SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="python",
            TOPAS_FAKE_PROFILE=self.profile,
            TOPAS_FAKE_TIME_SCALE=repr(self.time_scale),
            TOPAS_FAKE_NOISE=repr(self.noise),
            TOPAS_FAKE_SEED=str(self.seed),
        )
        return env

    def ready(self) -> bool:
        """``/health`` answers 200."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False
