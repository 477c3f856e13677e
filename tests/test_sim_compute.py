"""The compute model: roofline kernels, shape-dependent matmuls, overlap contention."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cocoviz.sim.collectives import collective_time
from cocoviz.sim.compute import (
    NO_CONTENTION,
    Contention,
    chunk_efficiency,
    chunked_matmul_times,
    combine,
    comm_contention,
    graph_launch_time,
    hbm_efficiency,
    kernel_time,
    matmul_cost,
    matmul_efficiency,
    matmul_time,
)
from cocoviz.sim.hardware import load_profile

PROFILES = ["v100-dgx2", "a100-dgx", "h100-dgx", "h200-hgx"]
GB = 1e9


@pytest.mark.parametrize("profile", PROFILES)
def test_large_square_matmul_approaches_achievable_peak(profile):
    hw = load_profile(profile)
    eff = matmul_efficiency(hw, 8192, 8192, 8192, "f16")
    assert eff <= hw.gpu.matmul_efficiency
    assert eff == pytest.approx(hw.gpu.matmul_efficiency, rel=0.10)


@pytest.mark.parametrize("profile", PROFILES)
def test_small_k_matmul_is_less_efficient_than_square(profile):
    hw = load_profile(profile)
    b, s, h, p = 8, 1024, 3072, 16
    megatron = matmul_efficiency(hw, b * s, h, h // p, "f16")  # [B·S, H/16] × [H/16, H]
    square = matmul_efficiency(hw, b * s, h, h, "f16")
    assert megatron < square
    assert megatron < 0.75 * hw.gpu.matmul_efficiency  # clearly below peak


def test_tiny_matmuls_are_far_from_peak():
    hw = load_profile("h100-dgx")
    assert matmul_efficiency(hw, 8, 4096, 4096, "f16") < 0.1  # decode-sized M
    assert matmul_efficiency(hw, 128, 128, 128, "f16") < 0.05


def test_wave_quantization():
    hw = load_profile("h100-dgx")
    full = matmul_cost(hw, 11 * 256, 12 * 128, 4096, "f16")  # 132 tiles of 256×128: one wave
    ragged = matmul_cost(hw, 11 * 256 + 1, 12 * 128, 4096, "f16")  # one row more
    assert full.waves == 1 and full.compute_s > full.memory_s
    assert ragged.time_s > 1.2 * full.time_s
    assert ragged.efficiency < 0.85 * full.efficiency


def test_split_k_helps_few_tiles_with_deep_k():
    hw = load_profile("a100-dgx")
    cost = matmul_cost(hw, 128, 128, 16384, "f16")
    assert cost.split_k > 1


@given(
    m=st.integers(min_value=1, max_value=20000),
    n=st.integers(min_value=1, max_value=20000),
    k=st.integers(min_value=1, max_value=20000),
    dtype=st.sampled_from(["f16", "bf16", "f32", "f64"]),
)
def test_matmul_time_grows_with_rows_and_columns(m, n, k, dtype):
    hw = load_profile("h100-dgx")
    t = matmul_time(hw, m, n, k, dtype, launch=False)
    assert t > 0
    assert matmul_time(hw, m + 37, n, k, dtype, launch=False) >= t
    assert matmul_time(hw, m, n + 37, k, dtype, launch=False) >= t
    assert matmul_efficiency(hw, m, n, k, dtype) <= hw.gpu.matmul_efficiency + 1e-9


def test_f32_gemm_runs_on_cuda_cores():
    hw = load_profile("a100-dgx")
    assert matmul_time(hw, 4096, 4096, 4096, "f32") > 10 * matmul_time(hw, 4096, 4096, 4096, "f16")


def test_matmul_launch_floor_and_dtype_check():
    hw = load_profile("h100-dgx")
    assert matmul_time(hw, 16, 16, 16, "f16") == pytest.approx(hw.gpu.launch_overhead_us * 1e-6)
    with pytest.raises(ValueError, match="unknown dtype 'f8'"):
        matmul_time(hw, 16, 16, 16, "f8")
    with pytest.raises(ValueError, match="non-negative"):
        matmul_time(hw, -1, 16, 16, "f16")


@pytest.mark.parametrize("profile", PROFILES)
def test_elementwise_kernels_are_memory_bound(profile):
    hw = load_profile(profile)
    nbytes = 3 * 2 * 256e6  # two reads and a write of 256M f16 elements
    t = kernel_time(hw, 256e6, nbytes, "f16")
    assert t == pytest.approx(
        hw.gpu.kernel_gap_us * 1e-6 + nbytes / (hw.gpu.hbm_gbps * GB * hbm_efficiency(hw, nbytes))
    )


def test_compute_bound_kernel_uses_the_vector_peak():
    hw = load_profile("h100-dgx")
    t = kernel_time(hw, 1e12, 1e6, "f32", launch=False)
    assert t == pytest.approx(
        1e12 / (hw.gpu.vector_tflops["f32"] * 1e12 * hw.gpu.vector_efficiency)
    )


def test_tiny_kernels_cost_a_launch():
    hw = load_profile("h100-dgx")
    assert kernel_time(hw, 10, 1000, "f16") == pytest.approx(hw.gpu.launch_overhead_us * 1e-6)
    assert kernel_time(hw, 10, 1000, "f16", launch=False) < 1e-6


def test_graph_nodes_pay_the_gap_not_the_host_launch():
    """In a CUDA graph a tiny kernel costs the GPU-side gap plus its body; the host's
    launch is paid once per graph. Large kernels cost the same either way."""
    hw = load_profile("h100-dgx")
    gap = hw.gpu.kernel_gap_us * 1e-6
    body = kernel_time(hw, 10, 1000, "f16", launch=False)
    assert kernel_time(hw, 10, 1000, "f16", graph=True) == pytest.approx(gap + body)
    assert kernel_time(hw, 10, 1000, "f16", graph=True) < kernel_time(hw, 10, 1000, "f16")
    assert matmul_time(hw, 16, 16, 16, "f16", graph=True) < matmul_time(hw, 16, 16, 16, "f16")
    big = (0, 8e9, "f16")
    assert kernel_time(hw, *big, graph=True) == pytest.approx(kernel_time(hw, *big))
    assert kernel_time(hw, 10, 1000, "f16", launch=False, graph=True) == body
    assert graph_launch_time(hw) == pytest.approx(hw.gpu.launch_overhead_us * 1e-6)
    assert chunked_matmul_times(hw, 64, 64, 64, "f16", 4, graph=True) == tuple(
        matmul_time(hw, 16, 64, 64, "f16", graph=True) for _ in range(4)
    )


@given(st.floats(min_value=1.0, max_value=1e12))
def test_kernel_time_is_monotone_in_bytes(nbytes):
    hw = load_profile("a100-dgx")
    t = kernel_time(hw, 0, nbytes, "f16", launch=False)
    assert kernel_time(hw, 0, nbytes * 1.01, "f16", launch=False) >= t


def test_hbm_efficiency_follows_the_profile_curve():
    hw = load_profile("h100-dgx")
    assert hbm_efficiency(hw, 1e6) == pytest.approx(0.60)
    assert hbm_efficiency(hw, 1e7) == pytest.approx(0.75)
    assert hbm_efficiency(hw, 1e9) == pytest.approx(0.90)
    assert 0.60 < hbm_efficiency(hw, 3e6) < 0.75
    assert hbm_efficiency(hw, 10) == pytest.approx(hw.gpu.hbm_efficiency_floor)


def test_chunking_a_matmul_costs_efficiency():
    hw = load_profile("h100-dgx")
    m, n, k = 8192, 3072, 192
    assert chunk_efficiency(hw, m, n, k, "f16", 1) == pytest.approx(1.0)
    effs = [chunk_efficiency(hw, m, n, k, "f16", c) for c in (2, 4, 16, 64)]
    assert all(e <= 1.0 + 1e-9 for e in effs)
    assert effs[-1] < effs[0]
    times = chunked_matmul_times(hw, 10, n, k, "f16", 3)
    assert len(times) == 3
    with pytest.raises(ValueError, match="cannot cut 2 rows into 3 chunks"):
        chunked_matmul_times(hw, 2, n, k, "f16", 3)


@pytest.mark.parametrize("profile", PROFILES)
def test_overlapping_communication_slows_compute(profile):
    hw = load_profile(profile)
    n = hw.gpus_per_node
    comm = collective_time(hw, "allreduce", 256 << 20, n, algo="ring")
    busy = comm_contention(hw, comm)
    assert busy.sm_fraction == pytest.approx(comm.channels / hw.gpu.sms)
    assert busy.hbm_gbps == pytest.approx(hw.overlap.hbm_bytes_per_reduce_byte * comm.bus_bw_gbps)
    # Compute-bound: at least the SMs the collective holds are lost.
    alone = matmul_time(hw, 8192, 8192, 8192, "f16", launch=False)
    shared = matmul_time(hw, 8192, 8192, 8192, "f16", contention=busy, launch=False)
    assert shared >= alone * hw.gpu.sms / (hw.gpu.sms - comm.channels) * 0.97
    # Memory-bound: HBM is shared.
    alone = kernel_time(hw, 0, 1e9, "f16", launch=False)
    shared = kernel_time(hw, 0, 1e9, "f16", contention=busy, launch=False)
    available = hw.gpu.hbm_gbps * hbm_efficiency(hw, 1e9)
    assert shared == pytest.approx(alone * available / (available - busy.hbm_gbps))


def test_network_collectives_interfere_less_than_nvlink_ones():
    hw = load_profile("h100-dgx")
    nvlink = comm_contention(hw, collective_time(hw, "allgather", 1 << 28, 8))
    across = collective_time(hw, "allgather", 1 << 28, 16)
    net = comm_contention(hw, across)
    assert nvlink.interference == hw.overlap.compute_slowdown_nvlink
    assert net.interference == hw.overlap.compute_slowdown_net
    assert net.hbm_gbps == pytest.approx(hw.overlap.hbm_bytes_per_copy_byte * across.bus_bw_gbps)


def test_combined_contention_adds_sms_and_bandwidth():
    a = Contention(sm_fraction=0.2, hbm_gbps=100.0, interference=0.15)
    b = Contention(sm_fraction=0.1, hbm_gbps=50.0, interference=0.02)
    both = combine(a, b)
    assert both.sm_fraction == pytest.approx(0.3)
    assert both.hbm_gbps == pytest.approx(150.0)
    assert both.interference == 0.15
    assert combine() == NO_CONTENTION
    hw = load_profile("h100-dgx")
    assert comm_contention(hw, collective_time(hw, "allreduce", 8, 1)) == NO_CONTENTION
