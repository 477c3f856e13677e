"""`cocoviz calibrate --local` (issue 27, item 4): a cpu-mpi profile fitted to micro-runs
of the CPU target, written as a complete profile that `--hw` loads; the fit recovers a
known machine from its simulated micro-runs, and (build) the command runs end to end."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cocoviz.cli import main
from cocoviz.ir.lower import load_program
from cocoviz.sim.collectives import collective_time, p2p_time
from cocoviz.sim.hardware import hbm_efficiency, load_profile
from cocoviz.sim.local_profile import (
    MICRO,
    fit_local,
    local_knobs,
    local_profile_toml,
    micro_program,
    starting_profile,
)
from cocoviz.sim.timeline import makespan


def _machine():  # type: ignore[no-untyped-def]
    """A made-up 2-rank machine: every knob away from the starting profile."""
    hw = starting_profile(2)
    values = {
        "gpu.hbm_gbps": 11.0,
        "gpu.hbm_efficiency.mid": 0.7,
        "gpu.hbm_efficiency.dram": 0.4,
        "gpu.vector_tflops.f32": 0.0031,
        "gpu.libm_call_ns": 7.0,
        "gpu.scalar_slowdown": 6.0,
        "gpu.sum_chain_ns": 0.9,
        "gpu.scalar_convert_slowdown.f16": 12.0,
        "gpu.scalar_convert_slowdown.bf16": 3.0,
        "gpu.convert_ns.f16_widen": 0.8,
        "gpu.convert_ns.f16_narrow": 3.0,
        "gpu.convert_ns.bf16_widen": 0.3,
        "gpu.convert_ns.bf16_narrow": 0.7,
        "gpu.matmul_tflops.f32": 0.0009,
        "gpu.matmul_tflops.f16": 0.0002,
        "gpu.matmul_tflops.bf16": 0.0005,
        "gpu.kernel_gap_us": 3.0,
        "nccl.measured.base_latency_scale.simple": 2.0,
        "nccl.measured.hop_latency_scale": 4.0,
        "nccl.measured.p2p_nvlink_efficiency": 0.6,
        "nccl.measured.p2p_latency_scale": 3.0,
        "overlap.hbm_bytes_per_copy_byte": 3.0,
        "overlap.hbm_bytes_per_reduce_byte": 4.0,
        "overlap.reduce_ns.f32": 0.9,
        "overlap.reduce_ns.f16": 2.5,
        "overlap.reduce_ns.bf16": 1.8,
        # the combine outweighs memory beyond the caches (reducescatter_far decides it)
        # and not halfway (reducescatter_large decides the bytes per wire byte; where the
        # combine outweighs them everywhere, as on this VM, the fit keeps the (T+1)/(T-1)
        # it starts from)
        "overlap.reduce_ns.far": 1.3,
        # a peer's lines written this step (allgather_dirty, and every allreduce's gather)
        "overlap.peer_dirty_ns": 0.08,
    }
    for knob in local_knobs():
        hw = knob.set(hw, values[knob.field])
    return dataclasses.replace(hw, source="<made-up machine>"), values


def _caches(mib: int):  # type: ignore[no-untyped-def]
    """A 2-rank CPU profile whose memory runs at its cached rate up to ``mib`` MiB and 4x
    slower from twice that on."""
    base = starting_profile(2)
    curve = ((1.0e3, 1.0), (mib * 2.0**20, 1.0), (2 * mib * 2.0**20, 0.25))
    return dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, hbm_efficiency=curve))


def _times(hw) -> dict[str, float]:  # type: ignore[no-untyped-def]
    return {m.name: makespan(micro_program(m.name, 2), hw) for m in MICRO}


def test_the_fit_recovers_a_known_machine_from_its_micro_runs() -> None:
    hw, _ = _machine()
    cal = fit_local(_times(hw), 2)
    assert max(abs(r.error) for r in cal.residuals) < 0.02
    fitted = cal.hardware
    assert fitted.gpu.hbm_gbps == pytest.approx(11.0, rel=0.05)
    assert fitted.gpu.hbm_efficiency[-1][1] == pytest.approx(0.4, rel=0.05)
    assert fitted.gpu.hbm_efficiency[-2][1] == pytest.approx(0.7, rel=0.05)
    assert fitted.gpu.matmul_tflops.f32 == pytest.approx(0.0009, rel=0.05)
    assert fitted.gpu.convert_ns.f16_widen == pytest.approx(0.8, rel=0.05)
    assert fitted.gpu.convert_ns.f16_narrow == pytest.approx(3.0, rel=0.05)
    assert fitted.gpu.convert_ns.bf16_narrow == pytest.approx(0.7, rel=0.05)
    assert fitted.gpu.libm_call_ns == pytest.approx(7.0, rel=0.05)
    assert fitted.gpu.scalar_slowdown == pytest.approx(6.0, rel=0.05)
    assert fitted.gpu.sum_chain_ns == pytest.approx(0.9, rel=0.05)
    halves = fitted.gpu.scalar_convert_slowdown
    assert halves is not None
    assert (halves.f16, halves.bf16) == (pytest.approx(12.0, rel=0.05), pytest.approx(3.0, rel=0.05))
    assert fitted.overlap.reduce_ns.f32 == pytest.approx(0.9, rel=0.05)
    assert fitted.overlap.reduce_ns.f16 == pytest.approx(2.5, rel=0.05)
    assert fitted.overlap.reduce_ns.bf16 == pytest.approx(1.8, rel=0.05)
    assert fitted.overlap.reduce_ns.far == pytest.approx(1.3, rel=0.05)
    assert fitted.overlap.peer_dirty_ns == pytest.approx(0.08, rel=0.05)
    assert fitted.overlap.hbm_bytes_per_reduce_byte == pytest.approx(4.0, rel=0.05)
    assert fitted.overlap.hbm_bytes_per_copy_byte == pytest.approx(3.0, rel=0.05)
    # a kernel call's fixed cost, launch and gap alike (ew_tiny)
    assert fitted.gpu.kernel_gap_us == pytest.approx(3.0, rel=0.05)
    assert fitted.gpu.launch_overhead_us == fitted.gpu.kernel_gap_us
    # MPI's all-to-all, its own fixed cost (alltoall_small; on 2 ranks the base and the hop
    # of the ring are one sum, so the scale itself is not unique, the latency is)
    want = collective_time(hw, "alltoall", 1024, 2).latency_s
    assert collective_time(fitted, "alltoall", 1024, 2).latency_s == pytest.approx(want, rel=0.05)


def test_the_written_profile_is_the_fitted_one(tmp_path: Path) -> None:
    hw, _ = _machine()
    times = _times(hw)
    cal = fit_local(times, 2)
    path = tmp_path / "cpu.toml"
    path.write_text(local_profile_toml(cal, 2, sorted(times.items())))
    loaded = load_profile(path)
    assert loaded.gpu.arch == "cpu" and loaded.gpu.sms == 1 and loaded.gpus_per_node == 2
    for m in MICRO:
        program = micro_program(m.name, 2)
        assert makespan(program, loaded) == pytest.approx(makespan(program, cal.hardware), rel=1e-3)
    for field in ("f16_widen", "f16_narrow", "bf16_widen", "bf16_narrow"):
        want = getattr(cal.hardware.gpu.convert_ns, field)
        assert getattr(loaded.gpu.convert_ns, field) == pytest.approx(want, rel=1e-5)
    assert loaded.gpu.libm_call_ns == pytest.approx(cal.hardware.gpu.libm_call_ns, rel=1e-5)
    assert loaded.gpu.scalar_slowdown == pytest.approx(cal.hardware.gpu.scalar_slowdown, rel=1e-5)
    assert loaded.gpu.sum_chain_ns == pytest.approx(cal.hardware.gpu.sum_chain_ns, rel=1e-5)
    got, want = loaded.gpu.scalar_convert_slowdown, cal.hardware.gpu.scalar_convert_slowdown
    assert got is not None and want is not None
    assert (got.f16, got.bf16) == (pytest.approx(want.f16, rel=1e-5), pytest.approx(want.bf16, rel=1e-5))
    for d in ("f32", "f16", "bf16", "far"):
        want = getattr(cal.hardware.overlap.reduce_ns, d)
        assert getattr(loaded.overlap.reduce_ns, d) == pytest.approx(want, rel=1e-5)
    assert loaded.gpu.vector_tflops.f16 == loaded.gpu.vector_tflops.f32  # float arithmetic
    text = path.read_text()
    assert text.startswith("# Written by `cocoviz calibrate --local`")
    assert "#   allgather_large" in text


def test_a_half_kernel_on_cpu_ranks_pays_its_conversions() -> None:
    """gpu.convert_ns (docs/cost-model.md, this machine): a kernel reading f16 and writing
    f32 pays one widening per element read, none narrowing; on CPU ranks its arithmetic is
    f32's; a GPU profile, which leaves the term out, pays nothing for it."""
    from cocoviz.ir.lower import load_program

    text = (
        "program cast\nranks 2\ndim N = 1048576\ninput g : f16[N] local\n"
        "y = cast(f32, g) * 2.0\noutput y\n"
    )
    program = load_program(text, "<cast>")
    base = starting_profile(2)

    def with_ns(**ns: float):  # type: ignore[no-untyped-def]
        convert = dataclasses.replace(base.gpu.convert_ns, **ns)
        return dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, convert_ns=convert))

    widen = makespan(program, with_ns(f16_widen=10.0)) - makespan(program, base)
    assert widen == pytest.approx(
        (10.0 - base.gpu.convert_ns.f16_widen) * 1e-9 * (1 << 20), rel=0.02
    )
    assert makespan(program, with_ns(f16_narrow=10.0)) == pytest.approx(makespan(program, base))
    assert load_profile("h100-dgx").gpu.convert_ns.f16_widen == 0.0


def test_cpu_ranks_run_ring_simple_and_reductions_cost_their_memory_traffic() -> None:
    """On CPU ranks memory decides a collective: a reduce-scatter reads T blocks and writes
    one, (T+1)/(T-1) bytes per wire byte against an allgather's 2; out of place an
    allgather also copies its own block (all S bytes, not the wire's (T-1)/T of them)."""
    hw = dataclasses.replace(starting_profile(2), source="<fast link>")
    assert hw.node.pci_gbps >= 100 * hw.gpu.hbm_gbps  # the link never decides
    size = 64 << 20
    rs = collective_time(hw, "reducescatter", size, 2)
    ag = collective_time(hw, "allgather", size, 2)
    ag_in_place = collective_time(hw, "allgather", size, 2, in_place=True)
    assert (rs.label, ag.label) == ("ring/Simple", "ring/Simple")
    assert rs.transfer_s / ag_in_place.transfer_s == pytest.approx(1.5, rel=0.01)
    assert ag.transfer_s / ag_in_place.transfer_s == pytest.approx(2.0, rel=0.01)
    # an allreduce: the reduce-scatter, then the allgather in place
    ar = collective_time(hw, "allreduce", size, 2)
    assert ar.transfer_s == pytest.approx(rs.transfer_s + ag_in_place.transfer_s, rel=0.01)
    assert p2p_time(hw, size).proto.value == "Simple"


def test_the_model_prices_an_allgather_in_place_where_the_emitted_program_runs_it_so() -> None:
    """An allgather of a slice an update made runs in place (the update writes this rank's
    block into the replicated target: docs/codegen.md) and copies only the peers' blocks;
    any other copies its own block too. The model's reading (`gathers_in_place`) agrees
    with the emitted program's (the manifest's ``in_place``) on every allgather of every
    sample and schedule, and both kinds occur."""
    import json

    from cocoviz import samples
    from cocoviz.emit.emitter import emit
    from cocoviz.ir.lower import load_file
    from cocoviz.schedule import apply_schedule_arg
    from cocoviz.sim.workload import gathers_in_place, make_context

    seen = set()
    for name in samples.names():
        program = load_file(samples.path(name))
        for schedule in (None, *(b.name for b in program.schedules)):
            p = apply_schedule_arg(program, schedule) if schedule else program
            manifest = json.loads(emit(p, program, target="cpu").files["manifest.json"])
            ctx = make_context(p, starting_profile(2))
            for step in manifest["scheduled"]["steps"]:
                if step.get("op") != "allgather" or step["kind"] != "collective":
                    continue
                (stage,) = step["stages"]
                if stage not in ctx.by_name or "staging" in json.dumps(step):
                    continue
                want = step["in_place"]
                assert gathers_in_place(ctx, ctx.by_name[stage]) == want, (name, schedule, stage)
                seen.add(want)
    assert seen == {True, False}


@pytest.mark.build
def test_calibrate_local_runs_on_this_machine(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "cpu.toml"
    code = main(["calibrate", "--local", "-o", str(out), "--build-dir", str(tmp_path / "b")])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# cpu-mpi profile of this machine, 2 ranks")
    assert {m.name for m in MICRO} <= set(printed.split())
    hw = load_profile(out)
    assert hw.gpu.arch == "cpu"
    assert main(["simulate", "adam", "--ranks", "2", "-D", "N=65536", "--hw", str(out)]) == 0


def test_calibrate_local_refuses_more_ranks_than_this_machine_has_cpus(
    tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    """A rank of the micro-runs is a core: --ranks beyond the CPUs this process may run on
    would time ranks sharing cores (and --ranks 99999 started 99,999 processes). Refused
    before anything is built or started."""
    from cocoviz.exec.mpi_run import usable_cpus

    for ranks in (usable_cpus() + 1, 99999):
        out = tmp_path / "cpu.toml"
        build = tmp_path / f"b{ranks}"
        code = main(["calibrate", "--local", "--ranks", str(ranks), "-o", str(out),
                     "--build-dir", str(build)])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 2, err
        assert f"--ranks {ranks}" in err and f"{usable_cpus()} CPU" in err, err
        assert not out.exists() and not build.exists()


def test_a_kernel_of_math_library_calls_pays_them_on_cpu_ranks() -> None:
    """gpu.libm_call_ns (docs/cost-model.md, this machine): each element of exp, log,
    tanh, sigmoid, gelu, pow (floats) and softmax is one call beside its FLOPs; an
    integer pow is not, nor a GPU profile's call (0: in the FLOPs)."""
    base = starting_profile(2)

    def with_calls(ns: float):  # type: ignore[no-untyped-def]
        return dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, libm_call_ns=ns))

    n = 1 << 20
    for expr, calls in (("exp(x)", 1), ("tanh(x) + log(x)", 2), ("gelu(x)", 1),
                        ("softmax(x)", 1), ("x * 2.0", 0)):  # fmt: skip
        text = f"program t\nranks 2\ndim N = {n}\ninput x : f32[N] local\ny = {expr}\noutput y\n"
        program = load_program(text, "<t>", None)
        slow, fast = makespan(program, with_calls(100.0)), makespan(program, with_calls(0.0))
        assert slow - fast == pytest.approx(calls * 100e-9 * n, rel=0.02), expr
    text = f"program t\nranks 2\ndim N = {n}\ninput x : i32[N] local\ny = pow(x, x)\noutput y\n"
    program = load_program(text, "<t>", None)
    assert makespan(program, with_calls(100.0)) == makespan(program, with_calls(0.0))
    assert load_profile("h100-dgx").gpu.libm_call_ns == 0.0


def test_a_reduction_on_cpu_ranks_costs_its_elements_not_only_its_bytes() -> None:
    """overlap.reduce_ns (docs/cost-model.md, this machine): a reduce-scatter in cache
    takes the larger of its byte price and its elements at the dtype's per-element cost,
    so a bf16 one costs what an f32 one of as many elements does; an allgather has no such
    term, and a GPU profile (0) prices bytes alone."""
    base = dataclasses.replace(starting_profile(2), source="<reduce>")
    ns = dataclasses.replace(base.overlap.reduce_ns, f32=2.0, bf16=2.0, f16=3.0)
    hw = dataclasses.replace(base, overlap=dataclasses.replace(base.overlap, reduce_ns=ns))
    n = 1 << 20
    f32 = collective_time(hw, "reducescatter", 4 * n, 2, dtype="f32")
    bf16 = collective_time(hw, "reducescatter", 2 * n, 2, dtype="bf16")
    f16 = collective_time(hw, "reducescatter", 2 * n, 2, dtype="f16")
    assert f32.transfer_s == pytest.approx(n * 2.0e-9) == pytest.approx(bf16.transfer_s)
    assert f16.transfer_s == pytest.approx(n * 3.0e-9)
    ag = collective_time(hw, "allgather", 4 * n, 2, dtype="f32")
    assert ag.transfer_s == collective_time(base, "allgather", 4 * n, 2).transfer_s
    h100 = load_profile("h100-dgx")
    assert collective_time(h100, "reducescatter", 2 * n, 8, dtype="bf16") == collective_time(
        h100, "reducescatter", 2 * n, 8
    )


def test_a_reduction_from_beyond_the_caches_costs_more_per_element() -> None:
    """overlap.reduce_ns.far (docs/cost-model.md, this machine): measured here, a
    reduce-scatter of 2^20 elements whose input lies beyond the caches takes ~0.165 ns an
    element more than one in cache, f32 and f16 alike. The share of it grows with the
    input's reuse distance along the memory curve: none in cache, all of it where the
    curve reaches its last point, and nothing on a curve that never falls."""
    base = dataclasses.replace(starting_profile(2), source="<far>")
    base = next(k for k in local_knobs() if k.field == "gpu.hbm_efficiency.dram").set(base, 0.4)
    ns = dataclasses.replace(base.overlap.reduce_ns, f32=2.0, f16=3.0, far=1.5)
    hw = dataclasses.replace(base, overlap=dataclasses.replace(base.overlap, reduce_ns=ns))
    n = 1 << 20

    def rs(dtype: str, size: int, distance: float, on=hw):  # type: ignore[no-untyped-def]
        return collective_time(on, "reducescatter", size * n, 2, dtype=dtype, reuse=(distance, 0.0))

    near, far = rs("f32", 4, 0.0).transfer_s, rs("f32", 4, 64 << 20).transfer_s
    assert near == pytest.approx(n * 2.0e-9)
    assert far == pytest.approx(n * 3.5e-9)
    assert rs("f16", 2, 64 << 20).transfer_s == pytest.approx(n * 4.5e-9)
    between = rs("f32", 4, 24 << 20).transfer_s
    assert near < between < far
    flat = dataclasses.replace(hw, gpu=dataclasses.replace(hw.gpu, hbm_efficiency=((1e3, 1.0),)))
    assert rs("f32", 4, 64 << 20, flat).transfer_s == pytest.approx(n * 2.0e-9)


def test_a_sum_or_norm_on_cpu_ranks_costs_its_adds_chain() -> None:
    """gpu.sum_chain_ns (docs/cost-model.md, this machine): a kernel's sum, norm or amax
    adds each element into 8 lanes in a fixed order, one add waiting for the one before:
    measured here, a norm of 2^20 f32 elements in cache takes ~110 us where its bytes and
    FLOPs are priced ~40. Each element it accumulates costs the term beside the FLOPs;
    an elementwise kernel, and a GPU profile (0), are priced as before."""
    base = dataclasses.replace(starting_profile(2), source="<chain>")

    def with_chain(ns: float):  # type: ignore[no-untyped-def]
        return dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, sum_chain_ns=ns))

    n = 1 << 20
    for expr, per in (("norm(x)", 1), ("sum(x) + amax(x)", 2), ("x * 2.0", 0)):
        text = f"program t\nranks 2\ndim N = {n}\ninput x : f32[N] local\ny = {expr}\noutput y\n"
        program = load_program(text, "<t>", None)
        slow, fast = makespan(program, with_chain(50.0)), makespan(program, with_chain(0.0))
        assert slow - fast == pytest.approx(per * 50e-9 * n, rel=0.02), expr
    text = f"program t\nranks 2\ndim N = {n}\ninput x : f32[N] sliced(0)\ny = norm(x)\noutput y\n"
    sliced = load_program(text, "<t>", None)  # each rank accumulates its half
    gap = makespan(sliced, with_chain(50.0)) - makespan(sliced, with_chain(0.0))
    assert gap == pytest.approx(50e-9 * n / 2, rel=0.02)
    assert load_profile("h100-dgx").gpu.sum_chain_ns == 0.0


def test_a_kernel_calling_libm_loses_its_simd_lanes_on_cpu_ranks() -> None:
    """gpu.scalar_slowdown and gpu.scalar_convert_slowdown: a kernel with a call per
    element does its FLOPs, and its f16 or bf16 conversions, that many times slower, each
    dtype by its own factor; one without calls, or whose only call is of scalars (made
    once per launch), is priced as before."""
    from cocoviz.sim.hardware import HalfSlowdown

    base = starting_profile(2)

    def with_gpu(**kw):  # type: ignore[no-untyped-def]
        return dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, **kw))

    slow = with_gpu(scalar_slowdown=5.0, scalar_convert_slowdown=HalfSlowdown(5.0, 5.0))
    f16_only = with_gpu(scalar_slowdown=5.0, scalar_convert_slowdown=HalfSlowdown(5.0, 1.0))
    flops_only = with_gpu(scalar_slowdown=5.0, scalar_convert_slowdown=HalfSlowdown(1.0, 1.0))
    n = 1 << 20

    def program(expr: str, dtype: str = "f16"):  # type: ignore[no-untyped-def]
        text = (
            f"program t\nranks 2\ndim N = {n}\nparam t: f32 = 2.0\ninput x : {dtype}[N] local\n"
            f"y = {expr}\noutput y\n"
        )
        return load_program(text, "<t>", None)

    with_call = program("exp(x * 0.001)")
    assert makespan(with_call, slow) > 1.5 * makespan(with_call, base)
    assert makespan(with_call, f16_only) == pytest.approx(makespan(with_call, slow))
    bf16_call = program("exp(x * 0.001)", "bf16")
    assert makespan(bf16_call, f16_only) == pytest.approx(makespan(bf16_call, flops_only))
    assert makespan(bf16_call, slow) > makespan(bf16_call, f16_only)
    for expr in ("x * 0.001", "x * pow(t, t)"):
        p = program(expr)
        assert makespan(p, slow) == pytest.approx(makespan(p, base)), expr


def test_a_value_the_caches_no_longer_hold_is_read_from_memory_on_cpu_ranks() -> None:
    """Reuse distance (docs/cost-model.md, this machine): a small kernel reading a value
    the rank last touched 48 MiB of traffic ago reads it at the memory rate beyond the
    caches; the same kernel reading what the stage before wrote reads it from cache. A
    GPU profile prices both by the kernel's own traffic."""
    hw = _caches(16)
    big, small = 4 << 20, 1 << 18  # f32 elements: 16 MiB, 1 MiB
    text = (
        f"program t\nranks 2\ndim N = {big}, M = {small}\ninput a : f32[N] local\n"
        f"input x : f32[M] local\n"
        "b = a * 2.0\nc = b * 3.0\ny = x * 2.0\nz = y * 3.0\noutput c\noutput z\n"
    )
    program = load_program(text, "<t>", None)
    from cocoviz.sim.workload import make_context

    ctx = make_context(program, hw)
    # x: read by y after a, b, c (16 MiB each, read or written): far; y read by z: near
    # (a distance counts the value and what the stage that touched it touched beside it,
    # line by line: y and the x its stage read, 1 MiB each)
    assert ctx.reuse[("y", "x")] >= 48 * 2**20 and ctx.reuse[("z", "y")] == 2 * small * 4
    from cocoviz.sim.compute import kernel_time

    far = kernel_time(
        hw, 0.0, 2.0 * small * 4, reuse=((small * 4.0, ctx.reuse[("y", "x")], 1.0),)
    )
    near = kernel_time(hw, 0.0, 2.0 * small * 4, reuse=((small * 4.0, 0.0, 1.0),))
    # the read 4x slower than in cache in a kernel fitted at 1.5 line transfers a byte: its
    # line 1 + 3 / 1.5 times the cached time, beside a store in cache
    gap = hw.gpu.kernel_gap_us * 1e-6
    assert far - gap == pytest.approx(2.0 * (near - gap), rel=1e-6)
    gpu = load_profile("h100-dgx")
    assert kernel_time(
        gpu, 0.0, 2.0 * small * 4, reuse=((small * 4.0, 1e9, 1.0),)
    ) == kernel_time(gpu, 0.0, 2.0 * small * 4)


def test_a_fused_kernel_reads_each_value_at_its_distance_where_the_kernel_first_reads_it() -> (
    None
):
    """A fused kernel prices each operand by the reuse distance where one of its members
    reads it, and each result by the distance of its storage (docs/cost-model.md, this
    machine): members that do not read a value say nothing about where it lies."""
    from cocoviz.schedule.steps import apply_steps

    hw = _caches(16)
    big, small = 4 << 20, 1 << 18
    text = (
        f"program t\nranks 2\ndim N = {big}, M = {small}\ninput a : f32[N] local\n"
        f"input x : f32[M] local\ninput w : f32[M] local\n"
        "b = a * 2.0\nc = b * 3.0\ny = w * 2.0\nz = y * x\noutput c\noutput z\n"
    )
    program = load_program(text, "<t>", None)
    fused = apply_steps(program, ["fuse(y, z)"], hw)
    near = dataclasses.replace(hw, gpu=dataclasses.replace(hw.gpu, hbm_efficiency=((1.0e3, 1.0),)))

    only_big = load_program(
        f"program t\nranks 2\ndim N = {big}\ninput a : f32[N] local\n"
        "b = a * 2.0\nc = b * 3.0\noutput c\n",
        "<t>",
        None,
    )

    def far_penalty(p):  # type: ignore[no-untyped-def]
        return makespan(p, hw) - makespan(p, near)

    # w and x lie 48 MiB of traffic back, and z's storage a step: the fused kernel moves
    # all three (1 MiB each) from where the curve is 4x the cached time, a line transfer
    # for each read and two for the fresh store, of the curve's 1.5 a byte; y, made
    # inside, not at all.
    per_mib = 2**20 / (hw.gpu.hbm_gbps * 1e9)
    far = (1 + 1 + 2) / 1.5 * (4 * per_mib - per_mib)
    assert far_penalty(fused) - far_penalty(only_big) == pytest.approx(far, rel=0.05)


def test_reuse_distances_count_only_what_a_fused_kernel_stores_and_reads_back() -> None:
    """The reuse walk sees the kernels that run (docs/cost-model.md, Kernels): a value a
    fused phase makes and reads again is neither stored nor read back, so it adds
    nothing to the distance of what the phase reads after it; a value a stage outside
    the phase reads is still stored, and the next phase reads it from memory."""
    from cocoviz.schedule.steps import apply_steps
    from cocoviz.sim.workload import make_context

    hw = starting_profile(2)
    n = 1 << 16  # f32: 256 KiB an array
    text = (
        f"program t\nranks 2\ndim N = {n}\ninput x : f32[N] local\n"
        "a = x * 2.0\nb = a + 1.0\ny = b * x\ns = sum(y)\nz = y * s\noutput z\n"
    )
    program = load_program(text, "<t>", None)
    size = 4.0 * n
    plain = make_context(program, hw).reuse
    # unfused: b read a and wrote b between x's read by a and by y (and x itself)
    assert plain[("y", "x")] == 3 * size
    # a step back: x and b beside it (y's stage), y (read by the sum and again by z),
    # the scalar s and z, each once; a count of bytes touched would put y there twice
    assert plain[("a", "x")] == pytest.approx(4 * size, abs=16)
    fused = make_context(apply_steps(program, ["fuse(a, b, y, s, z)"], hw), hw).reuse
    # one loop makes a, b and y: nothing of them touches memory before y reads x again
    assert fused[("y", "x")] == size  # x alone
    assert ("b", "a") not in fused and ("y", "b") not in fused
    # z runs after the sum's sync, a phase of its own: y is stored and read back
    assert ("z", "y") in fused
    assert fused[("a", "x")] == pytest.approx(3 * size, abs=16)  # y, z and x


def test_a_collective_on_cpu_ranks_moves_what_the_caches_no_longer_hold_at_the_memory_rate() -> (
    None
):
    """A collective's memory traffic on CPU ranks: half at the rate for its input's reuse
    distance, half at the rate for its output storage's (docs/cost-model.md, this
    machine). lamb's weight allgather writes the peers' blocks of the weights, last
    touched a whole step before: on a machine whose caches hold 16 MiB it is priced
    slower than the same call on data in cache; on a GPU profile, whose memory never
    binds a collective, the distances change nothing."""
    from cocoviz.ir.lower import RanksOverride, load_file
    from cocoviz.schedule import apply_schedule_arg
    from cocoviz.sim.workload import make_context

    hw = _caches(16)
    size = 4 << 20
    cached = collective_time(hw, "allgather", size, 2, in_place=True)
    far_out = collective_time(hw, "allgather", size, 2, in_place=True, reuse=(0.0, 64e6))
    far_both = collective_time(hw, "allgather", size, 2, in_place=True, reuse=(64e6, 64e6))
    assert far_out.transfer_s == pytest.approx(cached.transfer_s * (0.5 + 0.5 * 4), rel=0.01)
    assert far_both.transfer_s == pytest.approx(cached.transfer_s * 4, rel=0.01)
    gpu = load_profile("h100-dgx")
    assert collective_time(gpu, "allgather", size, 8, reuse=(1e9, 1e9)) == collective_time(
        gpu, "allgather", size, 8
    )

    program = load_file("samples/lamb.coco", {"N": 1 << 20}, RanksOverride.parse("2"))
    ctx = make_context(apply_schedule_arg(program, "rs_c_ag", hw), hw)
    # the step's other data since (each array a rank holds once: g 4 MiB, w 4, its
    # slices of m, v, r and the reduced gradient 2 each, the scalars) and w itself
    assert ctx.reuse[("w1", "w1")] == pytest.approx(18 * 2**20, abs=64)
    # made just before: w1_s (w's slice) and the r its stage read beside it
    assert ctx.reuse[("w1", "w1_s")] == pytest.approx(4 * 2**20, abs=64)
    # an update that reads its target stores into the lines its read fetched, and writes
    # them back before its next touch, a step away as its read's
    assert ctx.reuse[("m1", "m")] > 14 * 2**20
    assert ctx.reuse[("m1", "m1")] == ctx.reuse[("m1", "m")]
    assert "m1" in ctx.in_place_stores and "r" not in ctx.in_place_stores
    assert ctx.reuse[("r", "r")] > 14 * 2**20  # a fresh value: its storage, a step back


def test_an_update_counts_its_lines_once_on_the_memory_curve() -> None:
    """The memory curve's size is the distinct bytes a kernel touches (docs/cost-model.md,
    Kernels): an update reads its target and stores into the same lines, so a kernel
    moving 18 MiB whose two arrays hold 12 runs at the rate of a cache of 16, where a
    kernel writing a fresh array of the same traffic does not."""
    hw = _caches(16)
    n = 3 << 19  # f32: 6 MiB an array
    head = f"program t\nranks 2\ndim N = {n}\ninput w : f32[N] local\ninput m : f32[N] local\n"
    update = load_program(head + "w1 = update(w, w * 0.5 + m)\noutput w1\n", "<t>", None)
    fresh = load_program(head + "y = w * 0.5 + m\noutput y\n", "<t>", None)
    mib18 = 18 * 2**20 / (hw.gpu.hbm_gbps * 1e9)
    gap = hw.gpu.kernel_gap_us * 1e-6
    assert makespan(update, hw) == pytest.approx(gap + mib18, rel=1e-3)
    # 18 distinct MiB: past the cache, at the curve's rate for them
    slower = 1.0 / hbm_efficiency(hw, 18.0 * 2**20)
    assert slower > 1.1
    # its reads a line transfer each, its fresh store two: 24 for 18 bytes, of the curve's
    # 1.5 a byte
    lines = (12 + 2 * 6) / 18 / 1.5
    assert makespan(fresh, hw) == pytest.approx(gap + mib18 * (1 + lines * (slower - 1)), rel=1e-3)


def test_beyond_the_caches_a_store_into_lines_the_kernel_did_not_read_fetches_them() -> None:
    """Write-allocate (docs/cost-model.md, Kernels): beyond the caches a read moves a line
    in, a store into a line the kernel read writes it back, and a store into one it did
    not read fetches it first and writes it back. The memory curve is fitted on y = f(x)
    (3 transfers per 2 bytes counted), so such a kernel runs at the curve's rate, an
    update reading two arrays at 3 transfers per 3 bytes, and a fresh array of the same
    reads at 4."""
    hw = _caches(1)  # 4x slower beyond 2 MiB
    n = 1 << 20  # f32: 4 MiB an array
    head = f"program t\nranks 2\ndim N = {n}\ninput w : f32[N] local\ninput m : f32[N] local\n"
    mib = 2**20 / (hw.gpu.hbm_gbps * 1e9)  # a MiB at the cached rate
    gap = hw.gpu.kernel_gap_us * 1e-6
    copy = load_program(head + "y = w * 0.5\noutput y\n", "<t>", None)
    assert makespan(copy, hw) == pytest.approx(gap + 8 * 4 * mib, rel=1e-3)  # the curve's
    update = load_program(head + "w1 = update(w, w * 0.5 + m)\noutput w1\n", "<t>", None)
    fresh = load_program(head + "y = w * 0.5 + m\noutput y\n", "<t>", None)
    # a line transfer beyond the caches: (4 - 1) / 1.5 = 2 MiB-times more than a cached one
    assert makespan(update, hw) == pytest.approx(gap + 12 * mib + 3 * 4 * 2 * mib, rel=1e-3)
    assert makespan(fresh, hw) == pytest.approx(gap + 12 * mib + 4 * 4 * 2 * mib, rel=1e-3)


def test_a_collective_reading_what_its_peers_just_wrote_pays_for_their_lines() -> None:
    """``overlap.peer_dirty_ns`` (docs/cost-model.md, this machine): an allgather of a
    slice a kernel of the step wrote reads the peers' blocks from their caches, at that
    much per byte more than one of a program input; GPU profiles leave it out."""
    base = starting_profile(2)
    hw = dataclasses.replace(base, overlap=dataclasses.replace(base.overlap, peer_dirty_ns=0.1))
    size = 4 << 20
    clean = collective_time(hw, "allgather", size, 2)
    dirty = collective_time(hw, "allgather", size, 2, dirty=True)
    assert dirty.time_s - clean.time_s == pytest.approx(size / 2 * 0.1e-9, rel=1e-6)
    assert collective_time(base, "allgather", size, 2, dirty=True) == collective_time(
        base, "allgather", size, 2
    )
    gpu = load_profile("h100-dgx")
    assert collective_time(gpu, "allgather", size, 8, dirty=True) == collective_time(
        gpu, "allgather", size, 8
    )
    n = size // 4
    head = f"program t\nranks 2\ndim N = {n}\ninput x : f32[N] sliced(0)\n"
    made = load_program(head + "x1 = x * 1.5 + 0.5\ns = allgather(x1)\noutput s\n", "<t>", None)
    given = load_program(head + "s = allgather(x)\noutput s\n", "<t>", None)
    assert makespan(made, hw) - makespan(made, base) == pytest.approx(size / 2 * 0.1e-9, rel=1e-3)
    assert makespan(given, hw) == makespan(given, base)


def test_a_cpu_rank_runs_its_kernels_and_collectives_one_at_a_time() -> None:
    """A CPU rank is one thread (docs/cost-model.md, the timeline simulator): a kernel and
    a collective that do not depend on each other run one after the other, where a GPU's
    streams run them side by side."""
    from cocoviz.sim.predict import simulate

    text = (
        "program side\nranks 2\ndim N = 1048576, M = 4194304\ninput g : f16[N] local\n"
        "input x : f32[M] local\ny = x * 1.5 + 0.5\ns = reducescatter(+, g)\n"
        "output y\noutput s\n"
    )
    program = load_program(text, "<side>")
    for hw, serial in ((starting_profile(2), True), (load_profile("h100-dgx"), False)):
        tl = simulate(program, hw, warnings=False)
        events = {e.name: e for e in tl.events_of(0)}
        y, s = events["y"], events["s"]
        apart = y.end <= s.start or s.end <= y.start
        assert apart is serial
        if serial:
            assert tl.makespan == pytest.approx(y.duration + s.duration)
            assert y.slowdown == 1.0  # not slowed by a collective beside it: none runs
