"""Print the cost model next to published figures, and time the model itself.

    python bench/bench_collectives.py            # markdown tables for docs/cost-model.md
    python bench/bench_collectives.py --profiles # every profile constant with its source
    python bench/bench_collectives.py --speed    # calls per second of the model functions

The tables in docs/cost-model.md are this script's output; rerun it after changing a
profile or a formula and paste the result.
"""

from __future__ import annotations

import argparse
import time
from importlib import resources

from cocoviz.sim.collectives import collective_time
from cocoviz.sim.compute import chunk_efficiency, matmul_efficiency
from cocoviz.sim.hardware import list_profiles, load_profile

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10

# (profile, collective, ranks, ranks per node, algorithm, bytes, published busBw, source)
# from perf-data §2.1.
PUBLISHED = [
    ("a100-dgx", "allreduce", 8, 8, None, 16 * GIB, 232.0, "GTC24 S62129 (NVLink3 DGX)"),
    ("a100-dgx", "allreduce", 8, 8, "ring", 16 * GIB, 235.0, "ml-engineering (DGX A100)"),
    ("h100-dgx", "allreduce", 8, 8, "ring", 16 * GIB, 370.0, "GTC24 S62129; nccl-tests#212"),
    ("h100-dgx", "allreduce", 8, 8, None, 16 * GIB, 480.0, "GTC24 S62129 (NVLS)"),
    ("h200-hgx", "allreduce", 8, 8, "ring", 16 * GIB, 367.2, "ml-engineering, NCCL 2.27.7"),
    ("h200-hgx", "allgather", 8, 8, "ring", 16 * GIB, 361.4, "ml-engineering, NCCL 2.27.7"),
    ("h200-hgx", "reducescatter", 8, 8, "ring", 16 * GIB, 362.9, "ml-engineering, NCCL 2.27.7"),
    ("h200-hgx", "allreduce", 8, 8, None, 16 * GIB, 480.0, "ml-engineering (NVLS)"),
    ("h200-hgx", "allreduce", 4, 4, None, 8 * GIB, 363.3, "ml-engineering GPU sweep"),
    ("h200-hgx", "allreduce", 5, 5, None, 8 * GIB, 414.2, "ml-engineering GPU sweep"),
    ("h200-hgx", "allreduce", 6, 6, None, 8 * GIB, 435.6, "ml-engineering GPU sweep"),
    ("h200-hgx", "allreduce", 7, 7, None, 8 * GIB, 460.0, "ml-engineering GPU sweep"),
    ("h200-hgx", "allreduce", 8, 8, None, 8 * GIB, 473.1, "ml-engineering GPU sweep"),
    ("v100-dgx2", "allreduce", 16, 16, None, 16 * GIB, 122.0, "GTC24 S62129 (NVLink2 node)"),
    ("a100-dgx", "allreduce", 16, 8, None, 16 * GIB, 192.0, "GTC24 S62129 (8x200 Gb)"),
    ("a100-dgx", "allreduce", 64, 8, None, 16 * GIB, 192.0, "GTC24 S62129 (8x200 Gb)"),
    ("h100-dgx", "allreduce", 16, 8, "ring", 16 * GIB, 380.0, "GTC24 S62129 (8x400 Gb)"),
    ("h100-dgx", "allreduce", 64, 8, None, 16 * GIB, 380.0, "GTC24 S62129 (NVLS+Tree, 370-380; NVIDIA/nccl#1649)"),
    ("h100-dgx", "reducescatter", 8, 8, None, 8 * GIB, 362.2, "NVIDIA/nccl#1047 (ring, H100 node)"),
]

# AllReduce busBw on H100 clusters of 4-512 nodes (perf-data §2.1, arXiv 2411.13055).
SCAN = [(512 * KIB, "< 10"), (32 * MIB, "100-170"), (GIB, "~300"), (16 * GIB, "340-360")]


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def calibration_table() -> str:
    lines = [
        "| system | collective | ranks (nodes) | size | algorithm | model busBw | published | error | source |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for profile, coll, nranks, rpn, algo, nbytes, published, source in PUBLISHED:
        hw = load_profile(profile)
        cost = collective_time(hw, coll, nbytes, nranks, algo=algo, ranks_per_node=rpn)
        forced = " (forced)" if algo else ""
        error = cost.bus_bw_gbps / published - 1
        lines.append(
            f"| {profile} | {coll} | {nranks} ({cost.nnodes}) | {_size(nbytes)} | "
            f"{cost.label}{forced} | {cost.bus_bw_gbps:.1f} | {published:.1f} | "
            f"{error:+.1%} | {source} |"
        )
    return "\n".join(lines)


def scan_table() -> str:
    hw = load_profile("h100-dgx")
    header = "| size | published (4-512 nodes) | " + " | ".join(
        f"model, {n} nodes" for n in (4, 16, 64)
    )
    lines = [header + " |", "|---|---|---|---|---|"]
    for nbytes, published in SCAN:
        cells = []
        for nodes in (4, 16, 64):
            cost = collective_time(hw, "allreduce", nbytes, 8 * nodes)
            cells.append(f"{cost.bus_bw_gbps:.1f} ({cost.label})")
        lines.append(f"| {_size(nbytes)} | {published} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def latency_table() -> str:
    lines = ["| system | ranks | model, 8 B allreduce | reference |", "|---|---|---|---|"]
    refs = {
        "v100-dgx2": "15.6 µs (NCCL 2.6.4 model, perf-data §2.2)",
        "a100-dgx": "15.0 µs (NCCL master model, perf-data §1.5)",
        "h100-dgx": "12.5 µs measured on 8x H20 (DeepEP #303); 15.0 µs NCCL model",
        "h200-hgx": "12.5-15 µs (perf-data §7)",
    }
    for profile in list_profiles():
        hw = load_profile(profile)
        cost = collective_time(hw, "allreduce", 8, hw.gpus_per_node)
        lines.append(
            f"| {profile} | {hw.gpus_per_node} | {cost.time_s * 1e6:.1f} µs ({cost.label}) | "
            f"{refs[profile]} |"
        )
    return "\n".join(lines)


def gemm_table() -> str:
    b, s, h, p = 8, 1024, 3072, 16
    shapes = [
        ("square 8192³", 8192, 8192, 8192),
        (f"[B·S, H] × [H, H], H={h}", b * s, h, h),
        (f"Megatron [B·S, H/{p}] × [H/{p}, H]", b * s, h, h // p),
        ("decode [8, 4096] × [4096, 4096]", 8, 4096, 4096),
    ]
    lines = [
        "| shape (f16) | " + " | ".join(list_profiles()) + " |",
        "|---|" + "---|" * len(list_profiles()),
    ]
    for label, m, n, k in shapes:
        cells = [
            f"{matmul_efficiency(load_profile(name), m, n, k, 'f16'):.2f}"
            for name in list_profiles()
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for chunks in (4, 16):
        cells = [
            f"{chunk_efficiency(load_profile(name), b * s, h, h // p, 'f16', chunks):.2f}"
            for name in list_profiles()
        ]
        lines.append(
            f"| Megatron GEMM in {chunks} row chunks (time ratio) | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def _profile_lines(name: str) -> dict[str, tuple[str, str]]:
    """Dotted field -> (value as written, its source comment) from a shipped profile."""
    text = (resources.files("cocoviz.sim") / "profiles" / f"{name}.toml").read_text()
    table, table_note, pending, fields = "", "", "", {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            pending = line.lstrip("# ").strip() if table else ""
            if table and not any(k.startswith(f"{table}.") for k in fields):
                table_note = pending  # a comment under a table's header: its source
            continue
        code, _, note = line.partition("#")
        if code.startswith("["):
            table, table_note, pending = code.strip()[1:-1], note.strip(), ""
            continue
        key, _, value = code.partition("=")
        dotted = f"{table}.{key.strip()}" if table else key.strip()
        fields[dotted] = (value.strip(), note.strip() or pending or table_note)
        pending = ""
    return fields


def profile_table() -> str:
    names = list_profiles()
    per_profile = {name: _profile_lines(name) for name in names}
    keys = list(dict.fromkeys(k for n in names for k in per_profile[n]))
    lines = [
        "| field | " + " | ".join(names) + " | source |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    for key in keys:
        if key in ("name", "description"):
            continue
        # a field a profile leaves out: the model's neutral default (docs: Measured terms)
        values = [per_profile[n].get(key, ("—", ""))[0].replace("|", "/") for n in names]
        groups: dict[str, list[str]] = {}
        for n in names:
            if key in per_profile[n]:
                groups.setdefault(per_profile[n][key][1], []).append(n)
        if len(groups) == 1:
            source = next(iter(groups))
        else:
            source = "; ".join(f"{', '.join(ns)}: {note}" for note, ns in groups.items())
        lines.append(f"| `{key}` | " + " | ".join(values) + f" | {source.replace('|', '/')} |")
    return "\n".join(lines)


def speed() -> None:
    hw = load_profile("h100-dgx")
    sizes = [1 << k for k in range(3, 35)]
    start = time.perf_counter()
    calls = 0
    for _ in range(50):
        for nbytes in sizes:
            collective_time(hw, "allreduce", nbytes, 64)
            calls += 1
    elapsed = time.perf_counter() - start
    print(f"collective_time: {calls / elapsed:,.0f} calls/s")
    start = time.perf_counter()
    for m in range(1, 2001):
        matmul_efficiency(hw, m * 8, 3072, 192, "f16")
    print(f"matmul_cost: {2000 / (time.perf_counter() - start):,.0f} calls/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", action="store_true", help="time the model functions")
    parser.add_argument("--profiles", action="store_true", help="table of profile constants")
    args = parser.parse_args()
    if args.speed:
        speed()
        return
    if args.profiles:
        print(profile_table())
        return
    print("### Large-message bus bandwidth\n")
    print(calibration_table())
    print("\n### Small-message latency\n")
    print(latency_table())
    print("\n### H100 multi-node AllReduce scan\n")
    print(scan_table())
    print("\n### Matmul efficiency (achieved / dense peak)\n")
    print(gemm_table())


if __name__ == "__main__":
    main()
