"""The plugin's counters in SGLang's metrics (``--enable-metrics``).

SGLang serves Prometheus metrics at ``/metrics`` and collects counters that scheduler
processes create with ``prometheus_client`` (as ``observability/cpu_monitor.py`` does).
When metrics are enabled, each controller exports its :class:`~topas_sglang.controller.Stats`
as counters, brought up to date after every planned round, finish signal and fallback:

- ``topas:plan_rounds_total``: rounds planned afresh;
- ``topas:plan_seconds_total``: seconds spent planning (rounds and retraction orders),
  wall clock;
- ``topas:plan_cpu_seconds_total``: the same, in CPU seconds of the scheduler's thread
  (``time.thread_time``): what planning took from the scheduler, without the time it
  waited for a CPU that other processes held;
- ``topas:held_requests_total``: requests held back, summed over rounds;
- ``topas:fallbacks_total``: rounds that fell back to SGLang's own order after an error;
- ``topas:over_budget_rounds_total``: rounds that kept SGLang's order because the
  planning-time budget was spent;
- ``topas:finished_stages_total``: SGLang's finish signals for tagged requests;
- ``topas:reappeared_total``: stages signalled finished and then seen again.
"""

from __future__ import annotations

from typing import Any

COUNTERS = {
    "rounds": ("topas:plan_rounds_total", "TOPAS rounds planned afresh"),
    "decide_s": ("topas:plan_seconds_total", "Seconds TOPAS spent planning"),
    "decide_cpu_s": (
        "topas:plan_cpu_seconds_total",
        "CPU seconds of the scheduler's thread TOPAS spent planning",
    ),
    "held": ("topas:held_requests_total", "Requests TOPAS held back, summed over rounds"),
    "fallbacks": ("topas:fallbacks_total", "Rounds that fell back to SGLang's order"),
    "over_budget": ("topas:over_budget_rounds_total", "Rounds over TOPAS's time budget"),
    "finished": ("topas:finished_stages_total", "Stages SGLang signalled finished"),
    "reappeared": ("topas:reappeared_total", "Stages signalled finished and seen again"),
}
"""Stats field -> (metric name, help)."""

_counters: dict[str, Any] | None = None  # one set per process: names must be unique


def metrics_enabled() -> bool:
    """Whether the server runs with ``--enable-metrics`` (False outside a server)."""
    try:
        from sglang.srt.runtime_context import get_observability

        return bool(get_observability().enable_metrics)
    except Exception:  # noqa: BLE001 - no published server config (a bare cache, a test)
        return False


class Exporter:
    """Keeps SGLang's counters equal to a controller's stats (increments by the change)."""

    def __init__(self) -> None:
        global _counters
        if _counters is None:
            from prometheus_client import Counter

            _counters = {k: Counter(name, doc) for k, (name, doc) in COUNTERS.items()}
        self.counters = _counters
        self.seen: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)

    def update(self, stats: Any) -> None:
        for key, counter in self.counters.items():
            value = float(getattr(stats, key))
            if value > self.seen[key]:
                counter.inc(value - self.seen[key])
                self.seen[key] = value
