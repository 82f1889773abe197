"""Server profiles as the instance format, the generators and the command line see them.

The profiles' own numbers (fits, KV budgets, bandwidths) are tested in test_profiles.py;
this file tests how a profile reaches an instance: the ``server.profile`` record
(docs/formats.md), ``generate(profile=, movement=, swap_bytes_per_s=)``, and the
``topas profiles`` / ``--profile`` / ``--movement`` / ``--swap-gbps`` options.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from topas.cli import main
from topas.instance import (
    HostLoad,
    Instance,
    InstanceError,
    ProfileRecord,
    RecomputeLoad,
    load_instance,
)
from topas.profiles import (
    DEFAULT_PROFILE,
    PROFILES,
    ProfileError,
    get_profile,
    retime_instance,
)
from topas.timing import DEFAULT_LINEAR
from topas.workloads import generate


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------- the record


def test_profile_record_round_trips_and_hashes():
    inst = generate("chain", num_tasks=3, seed=2, movement="swap")
    doc = inst.to_dict()
    assert doc["server"]["profile"] == {
        "name": DEFAULT_PROFILE,
        "kv_bytes_per_token": 131072,
        "swap_bytes_per_s": get_profile(DEFAULT_PROFILE).host.bytes_per_s,
    }
    again = Instance.from_dict(json.loads(inst.to_json()))
    assert again == inst and again.content_hash == inst.content_hash


def test_a_file_without_profile_still_loads():
    doc = generate("chain", num_tasks=2, seed=0).to_dict()
    del doc["server"]["profile"]
    assert Instance.from_dict(doc).server.profile is None


def test_swap_rate_must_agree_with_the_recorded_profile():
    doc = generate("chain", num_tasks=2, seed=0, movement="swap").to_dict()
    doc["server"]["prefix_load"]["tokens_per_s"] *= 2
    with pytest.raises(InstanceError, match=r"server.prefix_load.tokens_per_s: .* disagrees"):
        Instance.from_dict(doc)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("swap_bytes_per_s", 0, r"server.profile.swap_bytes_per_s: must be a finite number > 0"),
        ("swap_bytes_per_s", -5.0, r"server.profile.swap_bytes_per_s"),
        ("kv_bytes_per_token", 1.5, r"server.profile.kv_bytes_per_token: must be a positive"),
        ("name", "", r"server.profile.name: must be a non-empty string"),
    ],
)
def test_bad_profile_records_are_named(field, value, message):
    doc = generate("chain", num_tasks=2, seed=0).to_dict()
    doc["server"]["profile"][field] = value
    with pytest.raises(InstanceError, match=message):
        Instance.from_dict(doc)


# --------------------------------------------------------------------------- generate


def test_default_profile_keeps_todays_numbers():
    inst = generate("metagpt-sop", num_tasks=5, seed=1)
    assert inst.server.cost_model == DEFAULT_LINEAR
    assert inst.server.chunk_tokens == 2048
    assert isinstance(inst.server.prefix_load, RecomputeLoad)
    # the prefix-share rule sizes the budget: prefixes take about half of it
    share = sum(a.prefix_tokens for a in inst.agents) / inst.server.kv_capacity_tokens
    assert 0.4 < share <= 0.5


def test_swap_movement_prices_a_prefix_at_mu_l_over_bswap():
    prof = get_profile(DEFAULT_PROFILE)
    inst = generate("chain", num_tasks=2, seed=0, movement="swap", swap_bytes_per_s=25e9)
    load = inst.server.prefix_load
    assert isinstance(load, HostLoad)
    # 25 GB/s over 128 KiB per token: 190,734.86 tokens/s; an 8192-token prefix 42.9 ms
    assert load.tokens_per_s == pytest.approx(25e9 / 131072)
    assert 8192 / load.tokens_per_s == pytest.approx(8192 * 131072 / 25e9)
    assert inst.server.profile == ProfileRecord(prof.name, 131072, 25e9)


def test_explicit_budget_beats_the_profile():
    inst = generate("chain", num_tasks=2, seed=0, kv_capacity_tokens=50_000)
    assert inst.server.kv_capacity_tokens == 50_000


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"profile": "nope/gpu"}, r"unknown profile 'nope/gpu' \(valid: "),
        ({"movement": "teleport"}, r"unknown prefix movement 'teleport'"),
        ({"swap_bytes_per_s": 0.0}, r"swap_bytes_per_s: must be a finite number > 0"),
        ({"swap_bytes_per_s": -1e9}, r"swap_bytes_per_s: must be a finite number > 0"),
    ],
)
def test_bad_profile_arguments_raise_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate("chain", num_tasks=2, seed=0, **kwargs)


def test_get_profile_names_the_choices():
    with pytest.raises(ProfileError, match="valid: " + ", ".join(PROFILES)):
        get_profile("h100")


def test_retime_keeps_the_problem_and_changes_the_clock():
    inst = generate("chain", num_tasks=3, seed=4, movement="swap")
    out = retime_instance(inst, DEFAULT_PROFILE, swap_bytes_per_s=10e9)
    assert out.tasks == inst.tasks and out.agents == inst.agents
    assert out.server.kv_capacity_tokens == inst.server.kv_capacity_tokens
    assert isinstance(out.server.prefix_load, HostLoad)
    assert math.isclose(out.server.prefix_load.tokens_per_s, 10e9 / 131072)
    plain = retime_instance(generate("chain", num_tasks=3, seed=4), None)
    assert isinstance(plain.server.prefix_load, RecomputeLoad)


# --------------------------------------------------------------------------- command line


def test_profiles_command_lists_every_profile(capsys):
    rc, out, err = run(capsys, "profiles")
    assert rc == 0 and not err
    for name in PROFILES:
        assert name in out
    rc, out, _ = run(capsys, "profiles", DEFAULT_PROFILE)
    assert rc == 0 and "KV/token   131072 bytes" in out and "B_swap" in out


@pytest.mark.parametrize(
    "args",
    [
        ("profiles", "nope"),
        ("generate", "chain", "--tasks", "2", "--profile", "nope"),
        ("generate", "chain", "--tasks", "2", "--swap-gbps", "0"),
        ("generate", "chain", "--tasks", "2", "--swap-gbps", "-3"),
        ("generate", "nope-workload", "--tasks", "2"),
    ],
)
def test_bad_profile_input_is_one_line_and_status_2(tmp_path, capsys, args):
    target = tmp_path / "out.json"
    full = [*args, "-o", target] if args[0] == "generate" else list(args)
    rc, out, err = run(capsys, *full)
    assert rc == 2
    assert err.startswith("topas: error: ") and err.count("\n") == 1
    assert not target.exists()


def test_generate_and_simulate_with_a_profile(tmp_path, capsys):
    inst_file = tmp_path / "i.json"
    rc, _, err = run(
        capsys, "generate", "chain", "--tasks", "4", "--movement", "swap",
        "--swap-gbps", "20", "-o", inst_file,
    )  # fmt: skip
    assert rc == 0, err
    inst = load_instance(inst_file)
    assert inst.server.profile is not None and inst.server.profile.swap_bytes_per_s == 20e9
    out = tmp_path / "r.json"
    rc, _, err = run(
        capsys, "simulate", inst_file, "--policy", "fcfs", "--swap-gbps", "40",
        "--out", out, "--no-progress",
    )  # fmt: skip
    assert rc == 0, err
    assert json.loads(Path(out).read_text())["summary"]["mean_jct"] > 0
    rc, _, err = run(
        capsys, "simulate", inst_file, "--policy", "fcfs", "--profile", "x", "--out", out
    )
    assert rc == 2 and "unknown profile 'x'" in err


def test_small_instances_and_the_gap_study_take_a_profile(tmp_path, capsys):
    from topas.studies.gap import GapConfig, validate_config
    from topas.workloads import small_instance

    inst = small_instance("chain", seed=3, profile="qwen2.5-32b/a100-80gb")
    assert inst.server.profile is not None
    assert inst.server.profile.name == "qwen2.5-32b/a100-80gb"
    assert inst.server.cost_model is not None and inst.server.cost_model.kind == "step"
    with pytest.raises(ValueError, match="profile: unknown profile 'nope'"):
        validate_config(GapConfig(families=("chain",), profile="nope"))
    rc, _, err = run(capsys, "gap", "--profile", "nope", "--out", tmp_path / "g")
    assert rc == 2 and "unknown profile 'nope'" in err and not (tmp_path / "g").exists()
