"""A local HTTP service in its own process group: started, waited for, stopped.

The fake-model SGLang server (:mod:`topas_sglang.fake_server`) and SGLang's router
(:mod:`topas_sglang.router`) are both one: a command line, an environment, a readiness
test. :meth:`Service.stop` sends SIGTERM to the launched process only (SGLang's launcher
stops its scheduler and detokenizer itself; a signal to the whole group kills the
scheduler first, which SGLang reports as a crash; the router drains its requests) and
SIGKILLs the group if it has not gone within ``stop_timeout``.

A port chosen at start (``port=0``) is free when chosen, but another process may take it
before the service binds it: SGLang binds its HTTP port only after its scheduler has
started (20-40 s), and a second server starting beside it picks its own internal ports
meanwhile. Uvicorn then logs "address already in use" and waits without exiting. The
start notices that line in the log, stops the process and tries again on a new port
(``port_tries`` in all); a port the caller fixed fails at once, with the port named.
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


PORT_TAKEN = ("address already in use", "port is already in use.")
"""What a failed bind logs, compared case-insensitively: uvicorn, the router and ZeroMQ
(the OS's message), and SGLang's check of its internal ports, which then exits (its
``server_args.py``; not its "Port N is already in use, trying port N+1", which moves on)."""


@dataclass(kw_only=True)
class Service:
    """One service process (module docstring). Subclasses give :meth:`command` and
    :meth:`ready`, and may add to :meth:`environment`."""

    port: int = 0  # 0: a free port, chosen at start
    log_path: Path | None = None  # its stdout and stderr (default: a temp file)
    start_timeout: float = 300.0
    stop_timeout: float = 30.0
    port_tries: int = 3  # launches on fresh ports when a chosen one is taken (docstring)
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
        """Launch the process and wait until :meth:`ready`; returns the service.

        With ``port=0`` a taken port is retried on a fresh one (module docstring)."""
        choose = not self.port
        tries = max(1, self.port_tries) if choose else 1
        for _ in range(tries):
            if choose:
                self.port = free_port()
            if self._launch():
                return self
        raise self.error(f"the {self.name}'s port {self.port} is taken:\n{self.tail()}")

    def _launch(self) -> bool:
        """One launch on ``self.port``, waited for: True once ready, False (stopped) if
        the port was taken; raises if the process dies or is not ready in time."""
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
            if self.port_taken():  # first: a failed bind may also end the process
                self.stop()
                return False
            if self.process.poll() is not None:
                code = self.process.returncode
                self.stop()
                raise self.error(f"the {self.name} exited ({code}):\n{self.tail()}")
            if self.ready():
                return True
            time.sleep(self.poll_s)
        self.stop()
        limit = f"{self.start_timeout:g} s"
        raise self.error(f"the {self.name} was not ready within {limit}:\n{self.tail()}")

    def port_taken(self) -> bool:
        """Whether the log says a bind failed because the address is in use."""
        if self.log_path is None or not self.log_path.exists():
            return False
        text = self.log_path.read_text(errors="replace").lower()
        return any(line in text for line in PORT_TAKEN)

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
