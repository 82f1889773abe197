"""Real SGLang 0.5.23 objects on the CPU for the plugin tests (skipped without SGLang).

The plugin is loaded once per process through SGLang's own ``load_plugins()`` (hooks
cannot be undone). With the plugin loaded, a cache built with the ``lru`` eviction
policy is SGLang as it ships: every hook passes SGLang's result through. Tests compare
that against a ``topas`` cache.
"""

from __future__ import annotations

from array import array

import pytest

sglang = pytest.importorskip("sglang")

from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def plugin():
    """SGLang discovers and runs the entry point (only ours: SGLANG_PLUGINS)."""
    import sglang.srt.plugins as plugins

    from topas_sglang.cpu_loop import load_plugin

    plugins._plugins_loaded = False
    load_plugin()
    return plugins


def make_cache(eviction: str = "topas", kv: int = 512, slots: int = 16, backend=None):  # type: ignore[no-untyped-def]
    """A UnifiedRadixCache as the scheduler builds it (backend None: SGLang chooses), with
    the TOPAS controller's time budget off: a test's rounds must plan whatever the wall
    clock says (with the default 1 ms a slow first plan left the next round to SGLang's
    order on a loaded machine). The budget's own test sets it."""
    from topas_sglang.cpu_loop import make_cache as build

    return build(eviction, kv, slots, backend=backend, budget_ms=0)


def schedule_policy(cache, name: str = "lpm") -> SchedulePolicy:  # type: ignore[no-untyped-def]
    return SchedulePolicy(name, cache, False, False, False)


def make_req(rid: str, tokens, custom_params=None, max_new: int = 4) -> Req:  # type: ignore[no-untyped-def]
    sp = SamplingParams(max_new_tokens=max_new, ignore_eos=True, custom_params=custom_params)
    sp.normalize(None)
    return Req(rid=rid, origin_input_text="", origin_input_ids=array("q", tokens),
               sampling_params=sp)  # fmt: skip


def cache_prompt(cache, tokens) -> None:  # type: ignore[no-untyped-def]
    """Put ``tokens`` in the tree, as a finished request leaves its prompt."""
    from topas_sglang.cpu_loop import insert_prompt

    insert_prompt(cache, tokens)


def cached_len(cache, tokens) -> int:  # type: ignore[no-untyped-def]
    return cache.tree_core.match_full_device_prefix(RadixKey(array("q", tokens)))[0]


def script(name: str):  # type: ignore[no-untyped-def]
    """``integration/sglang/<name>.py`` (a bench script, not a package module) as a module."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
