"""The one exception type for bad input.

:class:`InputError` is what a user can fix: a malformed file, an unknown name, a parameter
out of range. Every validation in the library raises it (or a subclass: ``InstanceError``,
``PolicySpecError``, ``ProfileError``, ...), so the command line can tell bad input (one
line, exit status 2) from a bug in topas (its own message and status, and a request to
report it).
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: the message names the file, field or parameter, and what is wrong."""
