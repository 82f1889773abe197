"""A local HTTP service in its own process group: started, waited for, stopped.

The fake-model SGLang server (:mod:`topas_sglang.fake_server`) and SGLang's router
(:mod:`topas_sglang.router`) are both one: a command line, an environment, a readiness
test. :meth:`Service.stop` sends SIGTERM to the launched process only (SGLang's launcher
stops its scheduler and detokenizer itself; a signal to the whole group kills the
scheduler first, which SGLang reports as a crash; the router drains its requests) and
SIGKILLs the group if it has not gone within ``stop_timeout``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServiceError(RuntimeError):
    """The service did not start (its log's tail is in the message) or died."""


@dataclass(kw_only=True)
class Service:
    """One service process (module docstring). Subclasses give :meth:`command` and
    :meth:`ready`, and may add to :meth:`environment`."""

    port: int = 0  # 0: a free port, chosen at start
    log_path: Path | None = None  # its stdout and stderr (default: a temp file)
    start_timeout: float = 300.0
    stop_timeout: float = 30.0
    python: str = sys.executable
    process: subprocess.Popen | None = field(default=None, init=False, repr=False)

    error: ClassVar[type[ServiceError]] = ServiceError
    name: ClassVar[str] = "service"  # in messages and the default log's name
    poll_s: ClassVar[float] = 1.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def ready(self) -> bool:
        """Whether the service answers as ready (called until it does)."""
        raise NotImplementedError

    def start(self):  # type: ignore[no-untyped-def]
        """Launch the process and wait until :meth:`ready`; returns the service."""
        if not self.port:
            self.port = free_port()
        if self.log_path is None:
            self.log_path = Path(tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")[1])
        with open(self.log_path, "wb") as log:  # the child keeps its own handle
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,  # its own process group, for stop()
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.stop()
                raise self.error(f"the {self.name} exited ({code}):\n{self.tail()}")
            if self.ready():
                return self
            time.sleep(self.poll_s)
        self.stop()
        limit = f"{self.start_timeout:g} s"
        raise self.error(f"the {self.name} was not ready within {limit}:\n{self.tail()}")

    def stop(self) -> None:
        """SIGTERM the launched process; SIGKILL the process group if it lingers."""
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
        """The last lines of the log (long lines cut)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(line[:300] for line in text)

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
