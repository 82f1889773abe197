"""SGLang plugin entry point (group ``sglang.srt.plugins``, name ``topas``).

SGLang's ``load_plugins()`` calls :func:`register` with no arguments in every process it
starts (the API server, the scheduler, the detokenizer), before the scheduler and its
radix cache exist. It registers, for SGLang 0.5.23 only:

- the ``topas`` radix eviction policy (``--radix-eviction-policy topas``), which also
  turns the TOPAS ordering on: it owns the per-scheduler controller;
- an AROUND hook on ``SchedulePolicy.calc_priority`` (order and hold-back);
- a REPLACE of ``Scheduler.get_prefill_adder_class`` (the adder that honours hold-backs);
- an AROUND hook on ``ScheduleBatch._get_decode_retraction_order`` (retraction victims);
- an AROUND hook on ``select_tree_core_backend`` (the Python tree core for ``topas``);
- an AROUND hook on ``ServerArgs.check_server_args`` (:func:`check_topas_args`: what the
  plugin refuses or warns about at start-up, before SGLang's own checks);
- an AROUND hook on ``create_tree_cache`` (a warning when the cache built is one the
  ``topas`` strategy cannot attach to);
- an AROUND hook on ``UnifiedRadixCache.on_release`` (SGLang's finish signal: a request
  released finished, not aborted, marks its stage done).

Without ``--radix-eviction-policy topas`` every hook passes SGLang's own result through.
"""

from __future__ import annotations

import logging

from topas_sglang import SGLANG_VERSION

logger = logging.getLogger("topas_sglang")

HOOKS = {
    "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority": ("calc_priority", "AROUND"),
    "sglang.srt.managers.scheduler.Scheduler.get_prefill_adder_class": (
        "prefill_adder_class",
        "REPLACE",
    ),
    "sglang.srt.managers.schedule_batch.ScheduleBatch._get_decode_retraction_order": (
        "retraction_order",
        "AROUND",
    ),
    "sglang.srt.mem_cache.unified_cache.tree_core_registry.select_tree_core_backend": (
        "tree_core_backend",
        "AROUND",
    ),
    "sglang.srt.server_args.ServerArgs.check_server_args": ("check_server_args", "AROUND"),
    "sglang.srt.mem_cache.registry.create_tree_cache": ("tree_cache_built", "AROUND"),
    "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.on_release": (
        "request_released",
        "AROUND",
    ),
}
"""Target -> (function in :mod:`topas_sglang.hooks`, hook type)."""


class VersionError(RuntimeError):
    """The installed SGLang is not the release the plugin is tested against."""


class UnsupportedSetting(ValueError):
    """A server setting TOPAS cannot honour yet (raised at start-up, one line)."""


PARALLEL_SIZES = ("dp_size", "pp_size")
"""Parallel settings refused above 1. Tensor parallelism is served: rank 0 plans and the
other ranks take its plan (:mod:`topas_sglang.ranks`). Data parallelism (several
schedulers, or DP attention's per-group queues) and pipeline parallelism (micro-batches
in flight) are not tested, so they are refused rather than left to chance."""


def check_topas_args(args) -> None:  # type: ignore[no-untyped-def]
    """With ``--radix-eviction-policy topas``: refuse data and pipeline parallelism (see
    :data:`PARALLEL_SIZES`). A cache the strategy cannot attach to (``--disable-radix-cache``
    among others) is reported where the cache is built
    (:func:`topas_sglang.hooks.tree_cache_built`)."""
    if str(getattr(args, "radix_eviction_policy", "")).lower() != "topas":
        return
    for name in PARALLEL_SIZES:
        n = getattr(args, name, 1)
        if isinstance(n, int) and n > 1:
            flag = "--" + name.replace("_", "-")
            raise UnsupportedSetting(
                f"--radix-eviction-policy topas does not support {flag} {n} yet: its plan is "
                f"shared across the ranks of one tensor-parallel group only; run with {flag} 1"
            )


def check_version(version: str) -> None:
    if version != SGLANG_VERSION:
        raise VersionError(
            f"topas-sglang supports SGLang {SGLANG_VERSION} only, found {version}: "
            f"the TOPAS plugin stays off (install sglang=={SGLANG_VERSION})"
        )


def register() -> bool:
    """Register the eviction policy and the hooks; returns False (and logs why) when the
    installed SGLang is another version, leaving SGLang untouched."""
    import sglang

    try:
        check_version(sglang.__version__)
    except VersionError as e:
        logger.error("%s", e)
        return False
    from sglang.srt.arg_groups.choices import (
        RADIX_EVICTION_POLICY_CHOICES,
        add_radix_eviction_policy_choices,
    )
    from sglang.srt.mem_cache.utils import _EVICTION_POLICY_FACTORIES
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from topas_sglang import hooks
    from topas_sglang.retention import NAME, TopasRetention

    _EVICTION_POLICY_FACTORIES[NAME] = TopasRetention
    if NAME not in RADIX_EVICTION_POLICY_CHOICES:
        add_radix_eviction_policy_choices([NAME])
    for target, (fn, kind) in HOOKS.items():
        HookRegistry.register(target, getattr(hooks, fn), HookType[kind])
    return True
