"""The one parameter conversion (topas/params.py) and its three users."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topas.errors import InputError
from topas.params import FALSE, TRUE, coerce, split_outside, unwrap
from topas.policies import PolicySpecError, make_policy
from topas.workloads import resolve_params


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        ("YES", bool, True),
        ("off", bool, False),
        (True, bool, True),
        ("7", int, 7),
        (7.0, int, 7),
        ("2.5", float, 2.5),
        (3, float, 3.0),
        ("x", str, "x"),
    ],
)
def test_converts(value, kind, expected):
    got = coerce(value, kind)
    assert got == expected and type(got) is kind


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("maybe", bool),
        (1, bool),  # only bools and the words: 1 is not silently True
        (True, int),
        (2.5, int),
        ("2.5", int),
        (True, float),
        ("nan", float),
        ("inf", float),
        (None, float),
        (3, str),
        ("none", int),  # not optional
    ],
)
def test_refuses(value, kind):
    with pytest.raises(ValueError, match="is not a valid"):
        coerce(value, kind)


def test_none_only_when_optional():
    assert coerce("None", int, optional=True) is None
    assert coerce(None, float, optional=True) is None


@given(st.integers(), st.booleans())
def test_round_trips_through_text(n, b):
    # a value written by str() reads back as itself: what a spec or --param carries
    assert coerce(str(n), int) == n and coerce(str(b), bool) is b
    assert coerce(repr(float(n)), float) == float(n)


def test_true_and_false_words_are_disjoint():
    assert not set(TRUE) & set(FALSE)


def test_policy_specs_and_workload_params_share_it():
    assert make_policy("topas:retract=on").retract is True
    assert make_policy("topas-greedy:redo=0").redo == 0.0
    with pytest.raises(PolicySpecError, match=r"aging='inf' is not a valid float"):
        make_policy("topas:aging=inf")
    with pytest.raises(PolicySpecError, match="unknown parameter 'preempt'"):
        make_policy("topas-greedy:preempt=0")  # renamed to redo
    params = resolve_params("chain", {"num_agents": "3", "carry_outputs": "no"})
    assert params["num_agents"] == 3 and params["carry_outputs"] is False
    with pytest.raises(InputError, match="parameter token_sigma: invalid value 'nan'"):
        resolve_params("chain", {"token_sigma": "nan"})
    assert not math.isnan(resolve_params("chain")["token_sigma"])


_PIECES = st.text(alphabet="ab=:+,", max_size=6)


@given(st.lists(st.tuples(_PIECES, st.booleans()), min_size=1, max_size=5))
def test_split_outside_keeps_what_parentheses_enclose(items):
    # Pieces joined by "," (each wrapped in parentheses or not, but only those free of
    # "," are left bare) split back into the same pieces; unwrap takes the parentheses off
    pieces = [f"({p})" if wrap or "," in p else p for p, wrap in items]
    parts = split_outside(",".join(pieces), ",")
    assert parts == pieces
    assert [unwrap(x) for x in parts] == [p for p, _ in items]


@pytest.mark.parametrize(
    ("text", "expected"),
    [(" (a,b) ", "a,b"), ("(a)+(b)", "(a)+(b)"), ("((a))", "(a)"), ("a", "a"), ("()", "")],
)
def test_unwrap_takes_one_enclosing_pair(text, expected):
    assert unwrap(text) == expected


@pytest.mark.parametrize("text", ["(a,b", "a)(b", "a,b)"])
def test_split_outside_refuses_unbalanced_parentheses(text):
    with pytest.raises(ValueError, match="unmatched"):
        split_outside(text, ",")
