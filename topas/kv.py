"""KV accounting: what a stage commits, what a state has committed, and the peak held.

One place for the rules that the engines, the SGLang plugin, the verifier and the
decision bench share (DESIGN.md, "Step model" rule 3 and the calibrated model):

- :func:`step_need`: in the step model a stage holds its input plus its output tokens
  from admission to end (rule 3): what the step engine commits, the verifier checks and
  the oracle charges; :func:`step_estimate` is what a policy may know of it (the predicted
  output, rule 11);
- :func:`reservation`: SGLang's ``PrefillAdder`` reservation for a stage that ignores EOS
  (input plus the rest of its predicted output, at least the next token), clipped to fit
  beside its prompt: what the calibrated engine and the live plugin commit at admission;
  :func:`sglang_kv_need` binds it to a source of stages and prompts as a ``KvNeed``;
- :func:`overrun_need`: a stage decoding past its prediction commits what it holds plus
  the KV of its next token (its reservation is used up);
- :func:`decode_steps_that_fit`: the decode iterations the KV actually held leaves room
  for (the calibrated engine retracts when it is 0);
- :func:`step_peak_kv`: the peak KV a step-model schedule holds.

The admission plan is the state's (``State.plan()``, a ``Planner``: a stage costs its
``State.need`` plus its prompt if absent, evictions free unused prompts) and the
committed figure (``State.kv_committed``, recounted by
:func:`topas.state.committed_kv`) is what admission control sees; the
calibrated engine also tracks the KV actually held (``kv_actual``: prompts, prefilled
input, decoded tokens), which may run over the committed one only while stages decode
past their predictions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from topas.instance import StageRef

if TYPE_CHECKING:
    from topas.schedule import Schedule


class _Predicted(Protocol):
    agent: str
    input_tokens: int
    predicted_output: int


def step_need(input_tokens: int, output_tokens: int) -> int:
    """Rule 3: the KV a stage holds in the step model, input plus output tokens."""
    return input_tokens + output_tokens


def step_estimate(input_tokens: int, predicted_output: int, room: int) -> int:
    """What a policy may know of :func:`step_need` (rule 11): the predicted output in place
    of the true one, clipped to ``room``, the KV beside the prompt (at least 1): the truth
    always fits there (validation), so no stage looks too big ever to fit."""
    return min(input_tokens + predicted_output, max(1, room))


def reservation(input_tokens: int, predicted_output: int, generated: int, room: int) -> int:
    """SGLang's reservation for a stage: its input plus ``max(predicted, generated + 1)``
    (after a retraction the generated tokens come back as prompt, and at least the next
    token needs KV), clipped to ``room``, the KV beside its prompt (at least 1): a
    prediction too long to fit even alone would otherwise wait for ever (the true length
    always fits, by validation)."""
    return min(input_tokens + max(predicted_output, generated + 1), max(1, room))


def sglang_kv_need(
    stage: Callable[[StageRef], _Predicted], prefix_tokens: Callable[[str], int], capacity: int
) -> Callable[[StageRef, int], int]:
    """The ``KvNeed`` of :func:`reservation`: ``stage(ref)`` gives a stage's agent, input
    and predicted output, ``prefix_tokens(agent)`` its prompt's size."""

    def need(ref: StageRef, generated: int) -> int:
        s = stage(ref)
        room = capacity - prefix_tokens(s.agent)
        return reservation(s.input_tokens, s.predicted_output, generated, room)

    return need


def overrun_need(held: int) -> int:
    """What a stage decoding past its predicted length commits: the KV it holds plus that
    of its next token."""
    return held + 1


def decode_steps_that_fit(capacity: int, held: int, decoding: int) -> int:
    """Decode iterations of ``decoding`` sequences that fit in the KV left beside what is
    actually ``held`` (each iteration adds one token per sequence): 0 means the next one
    must first make room (SGLang's ``retract_decode``). ``decoding`` must be positive."""
    return max(0, (capacity - held) // decoding)


def step_peak_kv(schedule: Schedule) -> int:
    """Peak KV held by a step-model schedule: stages hold :func:`step_need` from admission
    to end, prefixes their tokens from load start to end."""
    inst = schedule.instance
    events: list[tuple[float, int]] = []
    for r in schedule.runs:
        s = inst.stage(r.ref)
        kv = step_need(s.input_tokens, s.output_tokens)
        events += [(r.admit, kv), (r.end, -kv)]
    for p in schedule.prefixes:
        tokens = inst.agent_by_id[p.agent].prefix_tokens
        events += [(p.load_start, tokens), (p.end, -tokens)]
    events.sort()  # at equal times, releases (negative) come first
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak
