"""One conversion of parameter values, for policy specs, workload parameters and the CLI.

A value arrives as a string (a policy spec, ``--param KEY=VALUE``) or already typed (a
JSON instance, a Python call); :func:`coerce` turns it into the parameter's scalar kind
(``bool``, ``int``, ``float`` or ``str``) or refuses it with :class:`ValueError`, which
callers re-raise as their own one-line input error naming the parameter.
"""

from __future__ import annotations

import math
from typing import Any

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def coerce(value: Any, kind: type, optional: bool = False) -> Any:
    """``value`` as ``kind``; ``None`` (or the string ``none``) only when ``optional``.

    - bool: a bool, or one of :data:`TRUE` / :data:`FALSE` (any case);
    - int: an int (not a bool), an integral float, or a string ``int()`` reads;
    - float: a number or string that is finite (not a bool);
    - str: a string.
    """
    if optional and (value is None or (isinstance(value, str) and value.lower() == "none")):
        return None
    if kind is bool:
        if isinstance(value, bool):
            return value
        word = value.strip().lower() if isinstance(value, str) else None
        if word in TRUE or word in FALSE:
            return word in TRUE
    elif kind is int and not isinstance(value, bool):
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif kind is float and not isinstance(value, bool) and isinstance(value, int | float | str):
        try:
            out = float(value)
        except ValueError:
            pass
        else:
            if math.isfinite(out):
                return out
    elif kind is str and isinstance(value, str):
        return value
    raise ValueError(f"{value!r} is not a valid {kind.__name__}")


def split_outside(text: str, sep: str) -> list[str]:
    """``text`` split on ``sep`` where it stands outside parentheses, so that a value can
    carry a nested spec: ``"bases=(topas:fill=search,stall=0)+lpm,cross=0"`` split on
    ``","`` keeps the parenthesised spec whole. Pieces are not stripped. Raises
    :class:`ValueError` on an unbalanced parenthesis."""
    pieces, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unmatched ')' in {text!r}")
        elif ch == sep and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unmatched '(' in {text!r}")
    pieces.append(text[start:])
    return pieces


def unwrap(text: str) -> str:
    """``text`` stripped, without one pair of parentheses around the whole of it:
    ``" (topas:drain=0) "`` -> ``"topas:drain=0"``; ``"(a)+(b)"`` is left as it is."""
    text = text.strip()
    if not (text.startswith("(") and text.endswith(")")):
        return text
    try:
        split_outside(text[1:-1], ",")  # balanced inside: the pair encloses the whole
    except ValueError:
        return text
    return text[1:-1].strip()
