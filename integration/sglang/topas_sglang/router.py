"""SGLang's router (the model gateway, PyPI ``smg``) in front of several SGLang workers.

``python -m smg.launch_router --worker-urls URL... --policy POLICY`` runs the gateway's Rust
HTTP router (the package once published as ``sglang-router``). It takes a request's routing
key from the ``x-smg-routing-key`` header only, not from the ``routing_key`` field of a
``/generate`` body (it passes that field on to the worker untouched). Two of its policies
are keyed: ``consistent_hashing`` (the key on a hash ring of the worker URLs, stateless) and
``manual`` (the router remembers which worker each key went to). With the task id as the
key, every stage of a task reaches one worker, whose radix cache holds the task's context.

    with Router(worker_urls=[a.url, b.url], policy="consistent_hashing") as router:
        ...  # router.url

:meth:`Router.start` returns once the router reports every worker healthy
(``/readiness``), so the first requests are not all sent to the first worker that
registered. On SIGTERM (:meth:`topas_sglang.service.Service.stop`) the router drains
in-flight requests for up to its ``--shutdown-grace-period-secs``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from topas_sglang.service import Service, ServiceError

KEYED_POLICIES = ("consistent_hashing", "manual")
"""The router's policies that send every request with one routing key to one worker."""


class RouterError(ServiceError):
    """The router did not start (its log's tail is in the message) or died."""


@dataclass(kw_only=True)
class Router(Service):
    """One ``smg`` router process (module docstring)."""

    worker_urls: Sequence[str]
    policy: str = "consistent_hashing"
    extra_args: tuple[str, ...] = ()
    start_timeout: float = 60.0
    stop_timeout: float = 15.0

    error = RouterError
    name = "smg-router"
    poll_s = 0.5

    def command(self) -> list[str]:
        """The ``smg.launch_router`` command line."""
        return [
            self.python, "-m", "smg.launch_router",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *self.worker_urls,
            "--policy", self.policy,
            *self.extra_args,
        ]  # fmt: skip

    def ready(self) -> bool:
        """Every worker is healthy behind the router."""
        return self.healthy_workers() == len(self.worker_urls)

    def healthy_workers(self) -> int:
        """How many workers the router counts healthy (0 while it cannot be reached).

        ``/readiness`` answers 503 until one worker is healthy, then 200 with
        ``{"status": "ready", "healthy_workers": n, "total_workers": m}``."""
        try:
            with urllib.request.urlopen(self.url + "/readiness", timeout=2) as r:
                return int(json.loads(r.read()).get("healthy_workers", 0))
        except (urllib.error.URLError, OSError, ValueError):
            return 0
