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

Start-up takes 20-40 s on two cores. :meth:`FakeServer.stop` sends SIGTERM to the
launcher only (it stops the scheduler and detokenizer itself; a signal to the whole
process group kills the scheduler first, which SGLang reports as a crash) and SIGKILLs the
group if it has not gone within ``stop_timeout``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from topas_sglang.fake_model import MODEL_DIR

SGLANG_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority")
"""SGLang 0.5.23's own eviction policies (``--radix-eviction-policy``)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeServerError(RuntimeError):
    """The server did not start (its log's tail is in the message) or died."""


@dataclass
class FakeServer:
    """One fake-model SGLang server (module docstring)."""

    port: int  # 0: a free port, chosen at start
    max_total_tokens: int
    policy: str = "topas"  # a TOPAS spec ("topas", "topas-greedy:aging=0") or an SGLang policy
    schedule_policy: str = "lpm"
    overlap: bool = True  # SGLang's overlap scheduler (event_loop_overlap); off: event_loop_normal
    profile: str = "llama-3-8b/h100"  # TOPAS_FAKE_PROFILE: the iteration-time model
    time_scale: float = 1.0  # TOPAS_FAKE_TIME_SCALE
    noise: float = 0.0  # TOPAS_FAKE_NOISE
    seed: int = 0
    extra_args: tuple[str, ...] = ()
    log_path: Path | None = None  # the server's stdout and stderr (default: a temp file)
    start_timeout: float = 300.0
    stop_timeout: float = 30.0
    python: str = sys.executable
    process: subprocess.Popen | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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
            cmd += ["--radix-eviction-policy-config", json.dumps({"policy": self.policy})]
        if not self.overlap:
            cmd.append("--disable-overlap-schedule")
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SGLANG_EXTERNAL_MODEL_PACKAGE="topas_sglang.fake_model",
            SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="python",
            TOPAS_FAKE_PROFILE=self.profile,
            TOPAS_FAKE_TIME_SCALE=repr(self.time_scale),
            TOPAS_FAKE_NOISE=repr(self.noise),
            TOPAS_FAKE_SEED=str(self.seed),
        )
        return env

    def start(self) -> FakeServer:
        """Launch the server and wait until ``/health`` answers."""
        if not self.port:
            self.port = free_port()
        if self.log_path is None:
            import tempfile

            self.log_path = Path(tempfile.mkstemp(prefix="fake-sglang-", suffix=".log")[1])
        log = open(self.log_path, "wb")  # noqa: SIM115 (the child writes it until stop)
        self.process = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            start_new_session=True,  # its own process group, for stop()
        )
        log.close()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise FakeServerError(
                    f"the server exited ({self.process.returncode}):\n{self.tail()}"
                )
            if self.healthy():
                return self
            time.sleep(1.0)
        self.stop()
        raise FakeServerError(f"no /health within {self.start_timeout:g} s:\n{self.tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """SIGTERM the launcher; SIGKILL the process group if it lingers."""
        p = self.process
        if p is None:
            return
        self.process = None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # whatever of the group is left
        except ProcessLookupError:
            pass
        p.wait()

    def tail(self, lines: int = 30) -> str:
        """The last lines of the server's log (long lines cut)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(line[:300] for line in text)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
