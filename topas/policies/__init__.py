"""Policy registry and spec strings.

A spec is ``name`` or ``name:key=value,key=value`` for a registered policy, or
``package.module:Class[:key=value,...]`` for a user's own class. Packages can also
register policies under the entry-point group ``topas.policies``. A value that holds a
spec with parameters of its own goes in parentheses, which keep its commas:
``topas-rollout:bases=(topas:fill=search,stall=0)+lpm,cross=0``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
from importlib.metadata import entry_points
from typing import Any

from topas.errors import InputError
from topas.params import coerce, split_outside
from topas.policies.base import Policy, PolicyContext, admit_in_order
from topas.policies.baselines import ATLAS, CPF, FCFS, LAS, LPM, SPF, KVFlow, ParrotFCFS
from topas.policies.greedy import TOPASGreedy
from topas.policies.replay import Replay
from topas.policies.rollout import Rollout
from topas.policies.search import TOPAS, TOPASBase

REGISTRY: dict[str, type[Policy]] = {
    "fcfs": FCFS,
    "lpm": LPM,
    "cpf": CPF,
    "atlas": ATLAS,
    "kvflow": KVFlow,
    "spf": SPF,
    "parrot-fcfs": ParrotFCFS,
    "las": LAS,
    "replay": Replay,  # replays a recorded schedule: replay:file=RESULT.json
    "topas": TOPAS,  # the search over post-decision states (topas/policies/search.py)
    "topas-base": TOPASBase,  # the paper's TOPAS-base: the search without reuse and aging
    "topas-greedy": TOPASGreedy,  # the earlier single-pass scorer (topas/policies/greedy.py)
    "topas-rollout": Rollout,  # TOPAS with a rollout over base policies (policies/rollout.py)
}

BASELINES = ("fcfs", "lpm", "cpf", "atlas", "kvflow", "spf", "parrot-fcfs", "las")

__all__ = [
    "BASELINES",
    "REGISTRY",
    "Policy",
    "PolicyContext",
    "PolicySpecError",
    "admit_in_order",
    "available",
    "make_policy",
    "register",
    "split_specs",
]


class PolicySpecError(InputError):
    """A policy spec that names no policy or sets an unknown or ill-typed parameter."""


def register(name: str, cls: type[Policy]) -> None:
    REGISTRY[name] = cls


def _entry_point_policies() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group="topas.policies")}


def available() -> list[str]:
    return sorted(set(REGISTRY) | set(_entry_point_policies()))


def make_policy(spec: str) -> Policy:
    """Build a policy from a spec string (see module docstring)."""
    spec = spec.strip()
    if not spec:
        raise PolicySpecError("empty policy spec")
    head, _, rest = spec.partition(":")
    if "." in head or _is_user_module(head):  # package.module:Class[:params]
        cls_name, _, params = rest.partition(":")
        cls = _import_class(head, cls_name, spec)
        spec_name = f"{head}:{cls_name}"
    else:
        cls = _lookup(head)
        params = rest
        spec_name = head
    kwargs = _parse_params(cls, params, spec)
    try:
        policy = cls(**kwargs)
    except TypeError as e:
        raise PolicySpecError(f"policy spec {spec!r}: {e}") from None
    policy.name = spec if params else spec_name
    policy.check()
    return policy


def _is_user_module(head: str) -> bool:
    """A top-level module name that is not a registered policy: ``mymod:Class``."""
    if head in REGISTRY or head in _entry_point_policies():
        return False
    try:
        return importlib.util.find_spec(head) is not None
    except (ImportError, ValueError):
        return False


def _lookup(name: str) -> type[Policy]:
    if name in REGISTRY:
        return REGISTRY[name]
    eps = _entry_point_policies()
    if name in eps:
        return eps[name].load()
    raise PolicySpecError(f"unknown policy {name!r}; choose from {', '.join(available())}")


def _import_class(module: str, cls_name: str, spec: str) -> type[Policy]:
    if not cls_name:
        raise PolicySpecError(f"policy spec {spec!r}: expected package.module:Class")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise PolicySpecError(f"policy spec {spec!r}: cannot import {module}: {e}") from None
    cls = getattr(mod, cls_name, None)
    if not (isinstance(cls, type) and hasattr(cls, "decide")):
        raise PolicySpecError(f"policy spec {spec!r}: {module} has no policy class {cls_name!r}")
    return cls


def _parse_params(cls: type[Policy], params: str, spec: str) -> dict[str, Any]:
    fields = (
        {f.name: f for f in dataclasses.fields(cls) if f.init}
        if dataclasses.is_dataclass(cls)
        else {}
    )
    out: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in _split(params, spec))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise PolicySpecError(f"policy spec {spec!r}: expected key=value, got {item!r}")
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise PolicySpecError(
                f"policy spec {spec!r}: unknown parameter {key!r} (parameters: {known})"
            )
        out[key] = _convert(fields[key], value.strip(), spec)
    return out


_SCALARS = {"bool": bool, "int": int, "float": float, "str": str}


def _split(text: str, spec: str) -> list[str]:
    """``text`` split on the commas outside parentheses; an unbalanced one is the spec's
    error."""
    try:
        return split_outside(text, ",")
    except ValueError as e:
        raise PolicySpecError(f"policy spec {spec!r}: {e}") from None


def _field_kind(field: dataclasses.Field) -> type:
    """The scalar type of a parameter: ``int``, ``float``, ``bool`` or ``str``; for a union
    such as ``int | None`` (or ``Optional[int]``) its first scalar member."""
    if isinstance(field.type, type):
        return field.type
    text = str(field.type).replace("Optional[", "").replace("]", "")
    for part in text.replace(",", "|").split("|"):
        kind = _SCALARS.get(part.strip().split(".")[-1])
        if kind is not None:
            return kind
    args = getattr(field.type, "__args__", ())
    return next((a for a in args if a in _SCALARS.values()), str)


def _convert(field: dataclasses.Field, value: str, spec: str) -> Any:
    kind = _field_kind(field)
    try:
        return coerce(value, kind, optional="None" in str(field.type))
    except ValueError:
        raise PolicySpecError(
            f"policy spec {spec!r}: {field.name}={value!r} is not a valid {kind.__name__}"
        ) from None


_PARAMETER = re.compile(r"[A-Za-z_]\w*=")
"""A spec's parameter piece: ``key=`` with a plain name for key (a spec names a policy
first: ``lpm``, ``topas:...``, ``mymod:Class:...``)."""


def split_specs(text: str) -> list[str]:
    """Split a comma-separated list of policy specs, keeping a spec's own parameters:
    ``"topas:reuse=0,aging=0,lpm"`` -> ``["topas:reuse=0,aging=0", "lpm"]`` (a piece
    ``key=value``, its key a plain name, continues the previous spec's parameters, even
    where the value names specs itself: ``bases=topas+topas:drain=0``; commas inside
    parentheses split nothing: ``bases=(topas:fill=search,stall=0)+lpm``)."""
    out: list[str] = []
    for piece in (p.strip() for p in _split(text, text)):
        if not piece:
            continue
        if out and _PARAMETER.match(piece) and ":" in out[-1]:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out
