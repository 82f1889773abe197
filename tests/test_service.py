"""The service launcher's start-up (``topas_sglang.service``), with a stand-in process.

The stand-in binds its port as uvicorn does: on a taken port it logs the OS's message and
waits without exiting, which is what made a CI run wait out its 300 s start-up limit when
two fake-model servers started side by side and one's internal port was the other's HTTP
port. A taken port must be noticed in the log and, when the launcher chose it, retried.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from topas_sglang import service
from topas_sglang.service import Service, ServiceError

STAND_IN = """
import socket, sys, time
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError as e:
    print(f"ERROR: [Errno {e.errno}] error while attempting to bind: {e.strerror}", flush=True)
    time.sleep(600)  # as uvicorn: logged, not exited
s.listen()
print("listening", flush=True)
while True:
    s.accept()[0].close()
"""


@dataclass(kw_only=True)
class StandIn(Service):
    """A process that listens on its port, or logs a failed bind and hangs."""

    start_timeout: float = 20.0
    stop_timeout: float = 5.0
    poll_s = 0.05

    def command(self) -> list[str]:
        return [self.python, "-c", STAND_IN, str(self.port)]

    def ready(self) -> bool:
        """Its log says it listens (a connection could reach the test's own socket)."""
        return self.log_path is not None and "listening" in self.log_path.read_text()


@pytest.fixture
def taken() -> Iterator[int]:
    """A port held (listening) by this test process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_chosen_port_found_taken_is_retried_on_a_fresh_one(taken, monkeypatch, tmp_path):
    # The first choice is the held port; the launch must notice the logged bind failure
    # (well before its 20 s limit), stop that process and start again on a free port.
    real = service.free_port
    choices = iter([taken])
    monkeypatch.setattr(service, "free_port", lambda: next(choices, None) or real())
    began = time.monotonic()
    with StandIn(log_path=tmp_path / "s.log") as s:
        assert s.port != taken and s.ready()
    assert time.monotonic() - began < 10


def test_a_fixed_port_taken_fails_at_once_naming_it(taken, tmp_path):
    began = time.monotonic()
    with pytest.raises(ServiceError, match=f"port {taken} is taken"):
        StandIn(port=taken, log_path=tmp_path / "s.log").start()
    assert time.monotonic() - began < 10


def test_retries_stop_after_port_tries(taken, monkeypatch, tmp_path):
    launches = []
    monkeypatch.setattr(service, "free_port", lambda: launches.append(taken) or taken)
    s = StandIn(port_tries=2, log_path=tmp_path / "s.log")
    with pytest.raises(ServiceError, match="is taken"):
        s.start()
    assert len(launches) == 2 and s.process is None  # each launch stopped


def test_a_retry_only_on_the_failed_bind_lines():
    # SGLang's "Port N is already in use, trying port N+1" moves on by itself.
    s = StandIn()
    for text, taken in [
        ("ERROR:    [Errno 98] error while attempting to bind: Address already in use", True),
        ("Port is already in use. dist_init_port=1 port_base=2", True),
        ("Port 30001 is already in use, trying port 30002", False),
    ]:
        assert any(line in text.lower() for line in service.PORT_TAKEN) is taken
    assert not s.port_taken()  # no log yet
