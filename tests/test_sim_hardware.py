"""Hardware profiles: shipped data, user files, and error messages that name the field."""

from __future__ import annotations

import dataclasses
import re
from importlib import resources
from pathlib import Path

import pytest

from cocoviz.sim.hardware import (
    DEFAULT_PROFILE,
    Algo,
    Hardware,
    Link,
    ProfileError,
    Proto,
    list_profiles,
    load_profile,
)

SHIPPED = ["a100-dgx", "h100-dgx", "h200-hgx", "v100-dgx2"]


def _shipped_text(name: str) -> str:
    return (resources.files("cocoviz.sim") / "profiles" / f"{name}.toml").read_text()


def _write(tmp_path: Path, text: str, name: str = "mine.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _edit(name: str, old: str, new: str) -> str:
    """A shipped profile with one line changed (the line must exist exactly once)."""
    text = _shipped_text(name)
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_shipped_profiles_are_listed_and_load():
    assert list_profiles() == SHIPPED
    assert DEFAULT_PROFILE == "h100-dgx"
    for name in SHIPPED:
        hw = load_profile(name)
        assert isinstance(hw, Hardware)
        assert hw.name == name
        hash(hw)  # frozen and hashable: usable as a cache key


def test_profile_is_frozen():
    hw = load_profile("h100-dgx")
    with pytest.raises(dataclasses.FrozenInstanceError):
        hw.name = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "gpus", "sms", "nvlink", "net_per_node"),
    [
        ("v100-dgx2", 16, 80, 6 * 20.0, 8 * 12.5 * 0.96),
        ("a100-dgx", 8, 108, 12 * 20.0, 8 * 25.0 * 0.96),
        ("h100-dgx", 8, 132, 18 * 20.6, 8 * 50.0 * 0.96),
        ("h200-hgx", 8, 132, 18 * 20.6, 8 * 50.0 * 0.96),
    ],
)
def test_derived_bandwidths(name, gpus, sms, nvlink, net_per_node):
    hw = load_profile(name)
    assert hw.gpus_per_node == gpus
    assert hw.gpu.sms == sms
    assert hw.nvlink_gbps == pytest.approx(nvlink)
    assert hw.net_gbps(gpus) == pytest.approx(net_per_node)
    # One GPU of a node reaches only the NICs next to it.
    assert hw.net_gbps(1) == pytest.approx(
        net_per_node / hw.node.nics_per_node * max(1, hw.node.nics_per_node // gpus)
    )


def test_hopper_has_nvls_and_older_parts_do_not():
    assert load_profile("h100-dgx").nccl.nvls
    assert load_profile("h200-hgx").nccl.nvls
    assert not load_profile("a100-dgx").nccl.nvls
    assert not load_profile("v100-dgx2").nccl.nvls


def test_latency_tables_index_by_algo_and_proto():
    hw = load_profile("h100-dgx")
    assert hw.nccl.base_latency_us[Algo.RING][Proto.LL] == 6.6
    assert hw.nccl.hw_latency(Link.NVLINK)[Algo.RING][Proto.SIMPLE] == 3.4
    assert hw.nccl.hw_latency(Link.NET)[Algo.TREE][Proto.LL128] == 8.5
    assert hw.nccl.hw_latency(Link.NVLINK)[Algo.NVLS][Proto.SIMPLE] == 25.0
    assert hw.gpu.matmul_tflops["bf16"] == 989.4
    with pytest.raises(KeyError, match="unknown dtype 'f8'"):
        hw.gpu.matmul_tflops["f8"]


def test_nccl_version_selects_the_tuning_constants(tmp_path):
    """tuning.cc at each tag: NVLS 23 µs and Hopper's one-node llMaxBw 87.7 before 2.21,
    NVLS_TREE's NET latency 14 → 20.9 at 2.28.9, PAT ×0.85 → ×0.75 at 2.28.3."""
    now = load_profile("h100-dgx")
    assert now.nccl.version == "2.29.2"
    assert now.nccl.base_latency_us[Algo.RING][Proto.LL] == 6.6
    assert now.nccl.hw_latency(Link.NET)[Algo.NVLS_TREE][Proto.SIMPLE] == 20.9
    assert now.nccl.ll_max_bw.n1 == 141.0 and now.nccl.pat_bw_factor == 0.75
    old = load_profile(_write(tmp_path, 'base = "h100-dgx"\n[nccl]\nversion = "2.19.3"\n'))
    assert old.nccl.hw_latency(Link.NVLINK)[Algo.NVLS][Proto.SIMPLE] == 23.0
    assert old.nccl.hw_latency(Link.NVLINK)[Algo.TREE][Proto.SIMPLE] == 28.0
    assert old.nccl.hw_latency(Link.NET)[Algo.NVLS_TREE][Proto.SIMPLE] == 14.0
    assert old.nccl.ll_max_bw.n1 == 87.7 and old.nccl.pat_bw_factor == 0.85
    # Algorithms exist from the release that brought them.
    assert not old.nccl.pat and not old.nccl.symmetric and old.nccl.nvls
    assert load_profile("v100-dgx2").nccl.base_latency_us[Algo.RING][Proto.LL128] == 3.6


def test_a_profile_may_still_override_a_tuning_table(tmp_path):
    text = 'base = "h100-dgx"\n[nccl.base_latency_us]\n' + "\n".join(
        f"{a} = [1.0, 2.0, 3.0]" for a in ("tree", "ring", "nvls", "nvls_tree", "pat")
    )
    hw = load_profile(_write(tmp_path, text))
    assert hw.nccl.base_latency_us[Algo.RING][Proto.SIMPLE] == 3.0
    bad = _write(tmp_path, text.replace("ring = [1.0, 2.0, 3.0]", "ring = [1.0, 2.0]"))
    with pytest.raises(ProfileError, match="nccl.base_latency_us.ring"):
        load_profile(bad)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_number_in_a_shipped_profile_cites_a_source(name):
    """A numeric line carries a comment, or sits under a commented table header or comment."""
    context_has_comment = False
    for raw in _shipped_text(name).splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            context_has_comment = True
            continue
        if line.startswith("["):
            context_has_comment = "#" in line
            continue
        key, _, value = line.partition("=")
        value = value.split("#")[0].strip()
        if value.startswith('"'):
            continue  # strings: names and choices, not numbers
        assert "#" in line or context_has_comment, f"{name}.toml: {key.strip()} has no source"


def test_user_file_by_path(tmp_path):
    path = _write(tmp_path, _edit("h100-dgx", 'name = "h100-dgx"', 'name = "lab"'))
    hw = load_profile(path)
    assert hw.name == "lab"
    assert hw.source == str(path)
    assert load_profile(str(path)) == hw


def test_user_file_can_start_from_a_shipped_profile(tmp_path):
    path = _write(tmp_path, 'base = "h100-dgx"\nname = "h100-4nic"\n[node]\nnics_per_node = 4\n')
    hw = load_profile(path)
    base = load_profile("h100-dgx")
    assert hw.name == "h100-4nic"
    assert hw.node.nics_per_node == 4
    assert hw.gpu == base.gpu
    assert hw.net_gbps(8) == pytest.approx(base.net_gbps(8) / 2)


def test_unknown_profile_name_lists_the_known_ones():
    with pytest.raises(ProfileError) as err:
        load_profile("h100-dgz")
    assert "unknown hardware profile 'h100-dgz'" in err.value.message
    assert "did you mean 'h100-dgx'" in err.value.message
    for name in SHIPPED:
        assert name in err.value.message


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ProfileError, match="no such hardware profile file") as err:
        load_profile(missing)
    assert err.value.path == str(missing)


def test_bad_toml(tmp_path):
    path = _write(tmp_path, "name = \n")
    with pytest.raises(ProfileError, match=r"mine\.toml: not valid TOML"):
        load_profile(path)


@pytest.mark.parametrize(
    ("old", "new", "field", "problem"),
    [
        ("sms = 132 ", "", "gpu.sms", "missing"),
        ("sms = 132 ", 'sms = "many" ', "gpu.sms", "expected an integer, got 'many'"),
        ("sms = 132 ", "sms = 0 ", "gpu.sms", "must be at least 1, got 0"),
        ("hbm_gbps = 3350.0 ", "hbm_gbps = -1.0 ", "gpu.hbm_gbps", "must be greater than 0"),
        ("matmul = 0.803 ", "matmul = 1.5 ", "gpu.efficiency.matmul", "at most 1"),
        ("bf16 = 989.4 ", "bf16 = true ", "gpu.matmul_tflops.bf16", "expected a number, got True"),
        ('version = "2.29.2"', 'version = "2.12.12"', "nccl.version", "not tabulated"),
        ('version = "2.29.2"', 'version = "two"', "nccl.version", "expected an NCCL version"),
        ("channel_gbps = 27.93", "channel_gbps = 0.0", "nccl.measured.channel_gbps", "greater than 0"),
        ("nvls = true ", "nvls = 1 ", "nccl.nvls", "expected true or false"),
        ('intra_link = "nvlink"', 'intra_link = "usb"', "node.intra_link", "expected one of nvlink, pci"),
        ("sms = 132 ", "smss = 132 ", "gpu.sms", "missing ('gpu.smss' is not a field: a misspelling?)"),
        ("sms = 132 ", "sms = 132\nsmz = 1 ", "gpu.smz", "unknown field (did you mean 'gpu.sms'?)"),
        ("hbm = [[1.0e6, 0.60], [1.0e7, 0.75], [1.0e8, 0.90]]", "hbm = [[1.0e7, 0.75], [1.0e6, 0.60]]",
         "gpu.efficiency.hbm", "sorted"),
    ],
)  # fmt: skip
def test_errors_name_the_file_and_the_field(tmp_path, old, new, field, problem):
    path = _write(tmp_path, _edit("h100-dgx", old, new))
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert err.value.field == field
    assert err.value.message.startswith(f"{path}: field '{field}': ")
    assert problem in err.value.message


def test_missing_table_is_named(tmp_path):
    text = _shipped_text("h100-dgx")
    start = text.index("[device]")
    path = _write(tmp_path, text[:start])
    with pytest.raises(ProfileError, match=re.escape("field 'device': missing")):
        load_profile(path)


def test_nvls_needs_nvlink(tmp_path):
    path = _write(tmp_path, 'base = "h100-dgx"\n[node]\nintra_link = "pci"\n')
    with pytest.raises(ProfileError, match="field 'nccl.nvls': NVLS needs intra_link"):
        load_profile(path)


def test_base_must_be_a_shipped_profile(tmp_path):
    path = _write(tmp_path, 'base = "b200"\n')
    with pytest.raises(ProfileError, match="field 'base': expected the name of a shipped profile"):
        load_profile(path)


def _release(tmp_path: Path, text: str) -> Path:
    return _write(tmp_path, 'base = "h100-dgx"\nname = "mine"\n' + text)


def test_upto_tables_apply_at_their_release_and_before(tmp_path: Path) -> None:
    """``[nccl.measured.upto."X"]`` (docs/cost-model.md, Terms per NCCL release): laid over
    ``[nccl.measured]`` for NCCL X and earlier; the earliest release at or above the
    version decides; the profile's own release keeps its terms."""
    shipped = load_profile("h100-dgx").nccl.measured
    at = {
        v: load_profile(_release(tmp_path, f'[nccl]\nversion = "{v}"\n')).nccl.measured
        for v in ("2.21.5", "2.23", "2.26.5")
    }
    assert at["2.23"] == at["2.21.5"] != shipped
    assert at["2.23"].p2p_ll_peer_hops > 1 > shipped.p2p_ll_peer_hops  # rounds vs side by side
    assert at["2.26.5"] == shipped
    assert at["2.23"].net_congestion == shipped.net_congestion  # not in the layer: kept
    two = _release(
        tmp_path,
        '[nccl]\nversion = "2.19.3"\n[nccl.measured.upto."2.20"]\nchannel_gbps = 5.0\n',
    )
    hw = load_profile(two).nccl.measured
    assert hw.channel_gbps == 5.0 and hw.p2p_ll_peer_hops == at["2.23"].p2p_ll_peer_hops


def test_a_users_measured_term_holds_at_every_release(tmp_path: Path) -> None:
    """A term the user's profile sets (a calibrate fit at the user's release) is not
    replaced by the base's ``upto`` layers; the terms it leaves out still are."""
    path = _release(tmp_path, '[nccl]\nversion = "2.23"\n[nccl.measured]\np2p_ll_peer_hops = 0.5\n')
    m = load_profile(path).nccl.measured
    layer = load_profile(_release(tmp_path, '[nccl]\nversion = "2.23"\n')).nccl.measured
    assert m.p2p_ll_peer_hops == 0.5
    assert (
        m.channel_gbps == layer.channel_gbps != load_profile("h100-dgx").nccl.measured.channel_gbps
    )


@pytest.mark.parametrize(
    ("text", "field", "why"),
    [
        (
            '[nccl.measured.upto."2.x"]\nchannel_gbps = 1.0\n',
            "nccl.measured.upto",
            "expected an NCCL version",
        ),
        (
            '[nccl.measured.upto."2.20"]\nchanel_gbps = 1.0\n',
            'nccl.measured.upto."2.20".chanel_gbps',
            "unknown field",
        ),
        (
            '[nccl.measured.upto."2.20"]\nchannel_gbps = -1.0\n',
            'nccl.measured.upto."2.20".channel_gbps',
            "greater than 0",
        ),
        ("[nccl.measured]\nupto = 3\n", "nccl.measured.upto", "expected tables"),
        ('[nccl.measured.upto]\n"2.20" = 1\n', 'nccl.measured.upto."2.20"', "expected a table"),
    ],
)
def test_upto_tables_are_checked_used_or_not(
    tmp_path: Path, text: str, field: str, why: str
) -> None:
    """Every layer is checked, even one the version does not select (h100-dgx runs 2.29.2)."""
    with pytest.raises(ProfileError, match=why) as exc:
        load_profile(_release(tmp_path, text))
    assert exc.value.field == field


def test_convert_ns_takes_one_number_or_widen_and_narrow(tmp_path: Path) -> None:
    """``[gpu.convert_ns]`` (docs/cost-model.md, Kernels): per 16-bit float dtype, one
    number for both ways or ``[widen, narrow]``; absent: 0 (the GPU profiles)."""
    path = _release(tmp_path, "[gpu.convert_ns]\nf16 = [0.5, 2.0]\nbf16 = 0.25\n")
    ns = load_profile(path).gpu.convert_ns
    assert (ns.f16_widen, ns.f16_narrow, ns.bf16_widen, ns.bf16_narrow) == (0.5, 2.0, 0.25, 0.25)
    for text, why in (
        ("[gpu.convert_ns]\nf16 = [1.0]\n", "expected a list of 2 numbers"),
        ("[gpu.convert_ns]\nfp16 = 1.0\n", "unknown field"),
        ("[gpu.convert_ns]\nbf16 = -1.0\n", "at least 0"),
    ):
        with pytest.raises(ProfileError, match=why):
            load_profile(_release(tmp_path, text))


def test_scalar_convert_slowdown_is_per_half_dtype_and_at_least_one(tmp_path: Path) -> None:
    """``[gpu.scalar_convert_slowdown]`` (docs/cost-model.md, Kernels): f16 and bf16, each
    at least 1 (a loop without SIMD is never faster); a dtype left out is 1; absent, the
    conversions take ``scalar_slowdown`` (None here)."""
    path = _release(tmp_path, "[gpu.scalar_convert_slowdown]\nf16 = 10.0\n")
    halves = load_profile(path).gpu.scalar_convert_slowdown
    assert halves is not None and (halves.f16, halves.bf16) == (10.0, 1.0)
    assert load_profile("h100-dgx").gpu.scalar_convert_slowdown is None
    for text, why in (
        ("[gpu.scalar_convert_slowdown]\nf16 = 0.5\n", "at least 1"),
        ("[gpu.scalar_convert_slowdown]\nfp16 = 2.0\n", "unknown field"),
        ("[gpu.scalar_convert_slowdown]\nbf16 = [2.0, 3.0]\n", "expected a number"),
    ):
        with pytest.raises(ProfileError, match=why):
            load_profile(_release(tmp_path, text))
