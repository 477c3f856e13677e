"""The collective model against published measurements (issue 27): a validation table.

Every point is a published measurement of an NCCL collective. The test recomputes the
model's bus bandwidth for each, buckets the errors by node count × size × collective,
and checks the table printed in docs/cost-model.md ("Validation against published
sweeps") is the one the model gives now. Points are marked *fit* (the measured terms of
the profiles were fitted on them, see the docs) or *held out* (never used in a fit).

Error = model busBw / measured busBw − 1: positive means the model is optimistic.

Run ``python tests/test_model_validation.py`` to print the table.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from cocoviz.sim.calibrate import Sample, fit_samples, knobs_for
from cocoviz.sim.collectives import Algo, Coll, CollCost, bus_factor, collective_time
from cocoviz.sim.hardware import Hardware, load_profile

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

SOURCES = {
    "aic": "NVIDIA aiconfigurator, aic-core/src/aiconfigurator_core/systems/data/"
    "{h100_sxm,h200_sxm,a100_sxm}/comm/nccl/*/nccl_perf.parquet (nccl-tests out-of-place "
    "time, fp16, one process per node, collector/network/collect_nccl.py)",
    "mle-h200": "stas00/ml-engineering network/README.md, 8x H200 all_reduce_bench.py "
    "sweep (torch, NCCL 2.27.7; blocking: one call per CUDA-event pair)",
    "mle-count": "stas00/ml-engineering network/README.md, 8x H200 GPU-count sweep at "
    "8 GiB and the 16 GiB collectives (nccl-tests, NCCL 2.27.7)",
    "li-plus": "li-plus/playground cuda/nccl.md, sendrecv_perf -g 8 on 8x A100",
    "arxiv": "arXiv 2411.13055 H100 all-reduce scan, 4-512 nodes (plot in "
    "stas00/ml-engineering network/images/nccl-all-reduce-scan.png; read off the plot)",
    "gtc-nvlstree": "GTC24 S62129 NVLSTree all-reduce scan, 32-8K H100s (plot in "
    "stas00/ml-engineering network/images/nccl-all-reduce-scan-nvlstree.png; read off)",
    "gtc": "GTC24 S62129 'Collective Communication Bandwidth' slide (perf-data §2.1)",
    "nccl1244": "NVIDIA/nccl#1244, 2x8 H20 IB NDR, NCCL 2.21.5, NCCL_ALGO=NVLSTree",
}

# (system-version, nccl-tests op, GPUs, first size in bytes, out-of-place times in µs for
# sizes doubling from the first): NVIDIA aiconfigurator's nccl_perf tables.
AIC_SWEEPS = [
    ("a100-2.27.3", "all_gather", 2, 512, "8.98 9.08 9.06 9.37 10.47 11.43 11.97 12.52 12.37 13.57 15.61 19.95 38.1 43.28 59.72 93.44 153.7 266.3 496.4 939 1789.8"),
    ("a100-2.27.3", "all_gather", 4, 512, "10.76 10.77 11.03 11.02 11.84 13.88 15.08 15.38 15.52 15.88 18.61 22.53 52.93 60.7 73.19 118.5 176.5 325.4 578.5 1106.4 2102"),
    ("a100-2.27.3", "all_gather", 8, 512, "15.56 14.98 14.8 14.65 14.58 15.83 19.51 21.15 20.91 20.99 21.93 26.79 33.45 47.95 73.51 135 217.6 351.6 660.3 1216.8 2288"),
    ("a100-2.27.3", "all_reduce", 2, 512, "9.98 10.05 10 10.22 10.97 12.75 12.78 12.97 13.45 15.26 19.37 40.84 47.58 55.78 87.13 128.2 224.2 391.5 747.5 1430.1 2781.1"),
    ("a100-2.27.3", "all_reduce", 4, 512, "14.54 13.86 14.17 14.3 14.68 16.28 17.37 17.8 17.8 18.15 22.93 29.78 46.22 68.76 111 183.5 288 544.3 1000.5 1926.6 3716.3"),
    ("a100-2.27.3", "all_reduce", 8, 512, "22.57 21.77 21.53 21.43 21.27 22.55 25.96 28.06 27.41 27.5 30.08 38.85 53.7 77.31 128 216.5 367 595.3 1169.1 2182.5 4225.9"),
    ("a100-2.27.3", "alltoall", 2, 512, "10.52 10.59 10.83 11.09 11.6 12.48 13.87 13.91 14.44 14.71 17.24 22.79 28.62 38.19 56.05 98.31 136.5 243 445.6 844.5 1635.3"),
    ("a100-2.27.3", "alltoall", 4, 512, "12.43 12.39 12.44 12.4 12.64 13.23 14.11 14.51 14.96 15.67 18.6 25.2 36.15 41.44 60.84 104.4 172.9 312 573.5 1070.6 2065.7"),
    ("a100-2.27.3", "alltoall", 8, 512, "15.82 12.83 12.79 15.64 15.93 12.57 13.27 14.22 16.56 18.4 18.98 25.81 38.57 64.34 67.84 114.3 191.3 347.6 640.5 1197.9 2313.5"),
    ("a100-2.27.3", "reduce_scatter", 2, 512, "8.9 9.04 9.03 9.41 9.88 11.23 11.54 11.75 11.97 13.02 15.23 19.4 34.87 41.25 53.1 82.27 134.7 230.3 433.7 826 1611.8"),
    ("a100-2.27.3", "reduce_scatter", 4, 512, "10.75 10.82 10.72 11.21 11.5 12.59 13.7 13.87 14.55 14.33 16.89 21.08 48.69 56.68 66.87 109.3 165.9 303.3 538.7 1034.8 1982.3"),
    ("a100-2.27.3", "reduce_scatter", 8, 512, "15.58 15.25 15.02 14.65 14.52 15.1 16.83 18.04 18.16 18.2 19.08 23.43 34.21 52.03 79.49 123.4 210 327.2 624 1149.5 2207.1"),
    ("h100-2.23", "all_gather", 2, 2048, "5.98 6.01 6.87 7.35 7.51 7.99 8.22 8.42 10.4 12.14 19.03 27.87 38.19 57.9 95.8 164.3 299.8 561.5 1076.1"),
    ("h100-2.23", "all_gather", 4, 2048, "7.84 8.09 8.05 9.25 9.36 9.75 9.96 10.11 12.36 14.8 22.34 40.63 49.09 70.04 113.4 197.3 353 670.1 1290.1"),
    ("h100-2.23", "all_gather", 8, 2048, "11.18 11.34 11.25 13.67 14.76 16.73 14.75 16.47 17.4 18.62 24.97 36.28 46.96 71.13 130.6 213.9 396.8 747.1 1424.6"),
    ("h100-2.23", "alltoall", 2, 2048, "6.39 7 7.25 7.98 8.39 8.72 9.16 8.84 10.58 13.78 16.64 22.38 32.88 53.84 83.51 145.6 269.7 512.9 1000.3"),
    ("h100-2.23", "alltoall", 4, 2048, "7.83 9.47 8.19 13.67 8.48 9.06 9.03 9.71 12.46 14.96 21.49 24.82 38.63 67.35 109.2 192.5 353.8 670.1 1279.8"),
    ("h100-2.23", "alltoall", 8, 2048, "15.83 13.28 13.68 10.85 16.01 21.3 13.61 12.27 12.02 16.13 23.85 39.52 42.28 73.2 125.2 212.8 394.3 757.1 1468.6"),
    ("h100-2.23", "reduce_scatter", 2, 2048, "5.98 6.14 6.41 7.18 7.19 7.55 7.7 7.85 9.35 11.67 17.45 24.3 33.8 54.38 98.18 171.9 314.4 595.9 1108.2"),
    ("h100-2.23", "reduce_scatter", 4, 2048, "7.58 9.48 8.34 8.39 8.51 9.79 9.08 9.25 11.46 13.37 19.65 35.31 41.57 62.37 107 196.1 360 680.4 1311.5"),
    ("h100-2.23", "reduce_scatter", 8, 2048, "13.13 11.38 12.87 11.82 13.68 15.22 13.1 14.87 13.51 16.98 21.53 33.48 47.69 73.74 116.5 204.9 385.1 726.3 1407.1"),
    ("h100-2.29.2", "all_gather", 2, 512, "5.31 5.24 5.14 5.29 5.84 6.24 6.34 6.37 6.57 7.64 8.35 11.29 16.6 27.03 36.27 56 92.9 159.25 292.52 548.55 1038.56"),
    ("h100-2.29.2", "all_gather", 4, 512, "7.07 7.1 7.22 7.37 7.56 8.51 8.82 8.97 9.08 9.22 10.74 13.58 19.13 36.98 45.39 66.21 109.39 195.13 350.31 660.74 1267.46"),
    ("h100-2.29.2", "all_gather", 8, 512, "10.14 10.4 10.75 10.58 10.62 11.16 13.05 13.14 13.6 13.6 15.39 17.13 22.18 33.41 44.86 68.86 125.46 208.14 392.82 728.79 1401.5"),
    ("h100-2.29.2", "all_reduce", 2, 512, "6.18 5.85 6.32 6.46 6.77 7.27 7.08 7.29 7.7 8.81 10.74 14.74 27.86 33.1 47.3 82.17 143.55 254.57 466.24 881.29 1686.44"),
    ("h100-2.29.2", "all_reduce", 4, 512, "9.46 9.31 9.52 9.77 10.04 12.46 11.15 11.27 11.42 11.76 14.54 18.12 27.66 42.16 62.77 99.01 175.67 330.44 613.24 1181.02 2299.71"),
    ("h100-2.29.2", "all_reduce", 8, 512, "15.59 15.6 15.68 16.02 15.96 18.98 18.44 18.68 19 19.15 20.13 25.4 38.18 50.49 78.91 121.91 199.8 324.53 578.74 1092.1 2111.06"),
    ("h100-2.29.2", "alltoall", 2, 512, "6.49 6.58 6.47 6.55 6.84 7.95 9.13 11.96 13.97 14.15 14.4 14.85 15.52 21.16 31.18 53.05 81.24 139.8 259.64 494.74 958.87"),
    ("h100-2.29.2", "alltoall", 4, 512, "6.48 17.67 7 7.61 7.06 7.49 8.83 9.57 12.49 14.35 14.86 15.56 17.41 24.83 39.3 68.93 110.91 192.34 364.76 702.29 1397.04"),
    ("h100-2.29.2", "alltoall", 8, 512, "7.44 8.13 16.59 7.52 7.53 15.85 16.96 8.71 9.74 12.93 14.85 15.61 18.58 26.2 41.36 75.66 124.9 221.29 402.42 763.91 1490.42"),
    ("h100-2.29.2", "reduce_scatter", 2, 512, "6.07 5.14 5.35 5.32 5.81 5.95 6.19 6.28 6.34 7.35 8.32 10.67 15.39 23.79 32.41 53.18 95.68 169.09 311.52 585.11 1077.9"),
    ("h100-2.29.2", "reduce_scatter", 4, 512, "7.17 7.19 6.99 7.27 7.36 7.91 8.02 8.17 8.49 10.12 10.07 11.57 17.54 32.88 38.51 59.27 106.32 194.62 355.17 678.44 1299.82"),
    ("h100-2.29.2", "reduce_scatter", 8, 512, "10.24 10.34 10.26 10.58 10.49 10.93 11.46 11.71 12.02 12.17 12.33 14.64 17.9 29.88 43.82 69.67 111.29 200.75 382.18 721.72 1399.36"),
    ("h200-2.23", "all_gather", 2, 2048, "6.14 6.14 6.82 7.44 7.7 7.71 8.07 8.33 10.37 12.06 18.8 27.58 36.91 55.97 93.24 159.4 293.9 557.1 1069.3"),
    ("h200-2.23", "all_gather", 4, 2048, "7.89 7.77 8.07 9.28 9.52 11.58 10.17 9.84 12.47 15.04 21.14 37.6 46.42 68.32 110.8 194.7 350.9 665.9 1285.6"),
    ("h200-2.23", "all_gather", 8, 2048, "12.34 11.14 11.36 12.8 14.47 16.12 15.07 14.99 15.16 18.76 25.24 35.91 45.47 68.1 128.3 209.9 386.7 731.4 1417.8"),
    ("h200-2.23", "alltoall", 2, 2048, "6.85 6.98 7.35 8.32 8.52 8.35 8.97 8.72 10.54 13.85 15.91 20.35 30.25 51.38 81.61 142.2 259.2 492.1 952"),
    ("h200-2.23", "alltoall", 4, 2048, "8.82 9.37 8.84 9.52 8.83 10.93 10.72 10.85 12.8 14.44 22.09 23.94 37.55 65.47 108.6 190.1 347.3 667.1 1286.1"),
    ("h200-2.23", "alltoall", 8, 2048, "13.61 13.11 14.29 10.21 16.83 12.83 11.61 19.53 12.24 17.69 26.17 40.69 41.3 71.42 122.9 210.4 392.4 752.1 1463.7"),
    ("h200-2.23", "reduce_scatter", 2, 2048, "6.08 6.42 6.52 7.16 7.15 7.45 7.7 7.88 9.08 11.45 17.16 24.27 32.83 51.75 93.5 166.8 308.6 588.3 1102.1"),
    ("h200-2.23", "reduce_scatter", 4, 2048, "8.13 8.28 8.32 8.57 8.74 8.72 10.74 9.14 11.27 14.55 19.67 34.69 40.31 59.01 105 190.6 351.9 672.3 1301.5"),
    ("h200-2.23", "reduce_scatter", 8, 2048, "12.25 11.25 11.46 14.21 12.98 13.46 15.1 13.37 13.41 16.82 21.24 33.08 46.32 70.79 112.3 201.5 377.3 719.1 1398.8"),
    ("h200-2.29.2", "all_gather", 2, 512, "5.36 5.08 5.13 5.24 6.18 6.11 5.96 6.18 6.3 7.38 8.24 11.28 16.17 26.4 35.57 54.11 90.23 155.85 288.49 544.84 1041.88"),
    ("h200-2.29.2", "all_gather", 4, 512, "8.23 7.13 7.23 7.28 7.51 8.57 8.78 8.78 8.97 9.06 10.62 13.52 18.73 35.94 43.7 63.85 105.08 188.37 344.48 660.33 1271.68"),
    ("h200-2.29.2", "all_gather", 8, 512, "12.19 10.3 12.78 10.56 12.8 12.29 14.71 13.13 14.56 14.59 13.57 16.96 24.28 41.31 43.17 66.91 123.38 206.28 379.88 725.88 1394.97"),
    ("h200-2.29.2", "all_reduce", 2, 512, "6.05 6.01 6.31 6.69 6.71 7.27 7.28 7.43 7.53 8.69 10.37 14.26 26.84 32.39 45.63 76.2 139.11 248.32 463.01 885.82 1703.9"),
    ("h200-2.29.2", "all_reduce", 4, 512, "9.49 11.45 9.59 9.44 10.06 10.87 11.34 11.19 11.33 11.74 14.4 18.06 27.45 39.79 60.08 98.77 171.63 323.27 612.22 1180.42 2311.17"),
    ("h200-2.29.2", "all_reduce", 8, 512, "16.01 16.76 15.98 16.04 16.67 18.3 18.38 19.89 21.45 20.8 20.46 26.14 37.46 51.37 78.3 121.74 197.34 319.63 564.52 1052.63 2040.31"),
    ("h200-2.29.2", "alltoall", 2, 512, "6.35 6.4 6.66 6.85 7.22 7.84 9.25 11.48 13.05 13.65 13.37 13.52 15.01 19.82 29.28 51.84 80.41 137.21 251.45 470.26 901.69"),
    ("h200-2.29.2", "alltoall", 4, 512, "11.06 6.64 6.65 6.8 7.3 7.59 8.13 10.76 11.89 15.03 13.66 14.47 16.5 22.98 36.17 64.78 107 185.24 341.93 652.54 1262.38"),
    ("h200-2.29.2", "alltoall", 8, 512, "11.63 7.39 7.39 10.96 8.72 7.32 9.26 12.07 9.85 14.09 14.2 16.17 17.73 26.62 40.28 73.44 124.12 219.12 403.88 770.82 1509.91"),
    ("h200-2.29.2", "reduce_scatter", 2, 512, "5.26 5.16 5.25 5.34 5.63 6.01 6.05 6.29 6.05 7.23 8.03 10.42 15.12 23.38 31.64 50.58 92.03 163.93 304.99 581.67 1083.49"),
    ("h200-2.29.2", "reduce_scatter", 4, 512, "7.34 7.11 7.27 7.37 7.42 7.91 7.88 8.15 8.17 8.39 9.87 11.68 17.83 32.83 38.77 57.99 102.16 188.68 348.78 668.69 1294.13"),
    ("h200-2.29.2", "reduce_scatter", 8, 512, "12.58 10.24 10.61 10.77 12.52 13.29 11.55 13 11.81 13.25 13.72 14.41 19.71 30.43 44.72 69.45 111.62 198.83 375.59 716.34 1393.35"),
]  # fmt: skip
AIC_SYSTEMS = {  # system-version: (profile, NCCL version)
    "h100-2.29.2": ("h100-dgx", "2.29.2"),
    "h200-2.29.2": ("h200-hgx", "2.29.2"),
    "a100-2.27.3": ("a100-dgx", "2.27.3"),
    "h100-2.23": ("h100-dgx", "2.23"),
    "h200-2.23": ("h200-hgx", "2.23"),
}
AIC_COLLS = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "alltoall": "alltoall",
}

# 8x H200, NCCL 2.27.7, blocking calls (ml-engineering): (payload, busBw GB/s)
MLE_H200 = [
    (32 * KIB, 1.44), (64 * KIB, 2.93), (128 * KIB, 5.73), (256 * KIB, 11.74),
    (512 * KIB, 23.94), (1 * MIB, 39.93), (2 * MIB, 64.53), (4 * MIB, 107.16),
    (8 * MIB, 155.53), (16 * MIB, 219.89), (32 * MIB, 275.84), (64 * MIB, 346.51),
    (128 * MIB, 401.93), (256 * MIB, 436.15), (512 * MIB, 450.29), (1 * GIB, 463.58),
    (2 * GIB, 469.17), (4 * GIB, 473.10), (8 * GIB, 477.45), (16 * GIB, 482.26),
]  # fmt: skip
# 8x H200, NCCL 2.27.7 (ml-engineering): (coll, GPUs, algo forced, bytes, busBw)
MLE_COUNT = [
    ("allreduce", 4, None, 8 * GIB, 363.3), ("allreduce", 5, None, 8 * GIB, 414.2),
    ("allreduce", 6, None, 8 * GIB, 435.6), ("allreduce", 7, None, 8 * GIB, 460.0),
    ("allreduce", 8, None, 8 * GIB, 473.1), ("allreduce", 5, "ring", 8 * GIB, 364.4),
    ("allreduce", 6, "ring", 8 * GIB, 365.1), ("allreduce", 7, "ring", 8 * GIB, 365.7),
    ("allreduce", 8, "ring", 8 * GIB, 365.6), ("allreduce", 8, "ring", 16 * GIB, 367.2),
    ("allgather", 8, None, 16 * GIB, 361.4), ("reducescatter", 8, None, 16 * GIB, 362.9),
]  # fmt: skip
# 8x A100 sendrecv_perf -g 8 (each GPU sends to the next): (bytes, busBw); the 128 MiB
# row of the same run (110.8) is a warm-up outlier and is left out.
LI_PLUS = [(256 * MIB, 188.60), (512 * MIB, 192.75), (1 * GIB, 195.10)]
# H100 all-reduce busBw read off the arXiv 2411.13055 plot: {nodes: {MiB: busBw}}
ARXIV = {
    4: {4: 46, 16: 115, 64: 217, 256: 275, 1024: 338, 16384: 357},
    8: {4: 33, 16: 88, 64: 190, 256: 281, 1024: 330, 16384: 360},
    16: {4: 25, 16: 72, 64: 163, 256: 268, 1024: 325, 16384: 355},
    64: {4: 17, 16: 45, 64: 137, 256: 245, 1024: 305, 16384: 350},
    512: {16: 41, 64: 113, 256: 220, 1024: 287, 16384: 345},
}
# H100 NVLSTree all-reduce busBw read off the GTC24 plot: {nodes: {MiB: busBw}}
GTC_NVLSTREE = {
    4: {4: 53, 16: 125, 64: 230, 256: 313, 1024: 350, 16384: 375},
    16: {4: 30, 16: 75, 64: 175, 256: 298, 1024: 345, 16384: 378},
    128: {4: 20, 16: 45, 64: 125, 256: 250, 1024: 332, 16384: 370},
}
# (profile, ranks, ranks per node, busBw) at 16 GiB, default algorithm (GTC24 slide)
GTC = [("a100-dgx", 16, 8, 192.0), ("h100-dgx", 16, 8, 380.0)]
# 2x8 H20 (Hopper NVLink, 8x NDR per node), NCCL 2.21.5, NVLSTree: (bytes, µs)
NCCL1244 = [(8, 47.60), (64, 46.30), (256, 46.65), (512, 46.58)]


@dataclass(frozen=True)
class Point:
    """One published measurement."""

    source: str
    profile: str
    version: str | None
    coll: str
    nranks: int
    ranks_per_node: int
    nbytes: int
    busbw: float
    """Measured bus bandwidth, GB/s (nccl-tests' busbw)."""
    fitted: bool
    """A fit point of the shipped profiles, which are the refit (``refit_profiles``: the
    split of docs/cost-model.md); else held out."""
    algo: str | None = None
    blocking: bool = False

    @property
    def nnodes(self) -> int:
        return -(-self.nranks // self.ranks_per_node)


GLITCH = 1.5
"""A point of a sweep (or two adjacent points) slower than ``GLITCH`` × both neighbours in
the same sweep is a measurement glitch and is left out (docs/cost-model.md lists each)."""


def glitches(times: list[float]) -> set[int]:
    """Indices of a sweep's glitches: a point, or two adjacent points, each slower than
    ``GLITCH`` × both the points on either side of them (never an end point)."""
    out: set[int] = set()
    for i in range(1, len(times) - 1):
        if times[i] > GLITCH * max(times[i - 1], times[i + 1]):
            out.add(i)
        if i + 2 < len(times) and min(times[i], times[i + 1]) > GLITCH * max(
            times[i - 1], times[i + 2]
        ):
            out |= {i, i + 1}
    return out


def excluded_points() -> list[tuple[str, str, int, int, float]]:
    """(system-version, op, GPUs, bytes, µs) of every sweep point ``glitches`` leaves out."""
    out = []
    for system, op, n, first, times in AIC_SWEEPS:
        t = [float(x) for x in times.split()]
        out += [(system, op, n, first << i, t[i]) for i in sorted(glitches(t))]
    return out


REFIT_SYSTEMS = ("h100-2.29.2", "h100-2.23", "a100-2.27.3")
"""The sweeps the refit fits on (every other size of them, ``_refit_size``); the H200
sweeps are held out whole."""


def _refit_size(nbytes: int) -> bool:
    """The refit's fit sizes: odd powers of two (512 B, 2 KiB, ..., 2 MiB, 8 MiB, ...);
    the even ones (1 KiB, 4 KiB, ..., 1 MiB, 4 MiB, 16 MiB, 64 MiB, ...) are held out."""
    return nbytes.bit_length() % 2 == 0


def points() -> list[Point]:
    """Every published point, marked fit or held out (shipped profiles and refit), less
    the glitches (``glitches``)."""
    out: list[Point] = []
    for system, op, n, first, times in AIC_SWEEPS:
        profile, version = AIC_SYSTEMS[system]
        coll = AIC_COLLS[op]
        t = [float(x) for x in times.split()]
        skip = glitches(t)
        for i, us in enumerate(t):
            if i in skip:
                continue
            size = first << i
            busbw = size / (us * 1e-6) / 1e9 * bus_factor(coll, n)
            fit = system in REFIT_SYSTEMS and _refit_size(size)
            out.append(Point("aic", profile, version, coll, n, n, size, busbw, fit))
    for size, busbw in MLE_H200:  # launch_us fitted on these (the refit keeps it)
        out.append(Point("mle-h200", "h200-hgx", "2.27.7", "allreduce", 8, 8, size, busbw,
                         True, blocking=True))  # fmt: skip
    for coll, n, algo, size, busbw in MLE_COUNT:
        out.append(Point("mle-count", "h200-hgx", "2.27.7", coll, n, n, size, busbw, False, algo))
    for size, busbw in LI_PLUS:  # the p2p pair efficiency is set from these
        out.append(Point("li-plus", "a100-dgx", None, "sendrecv", 2, 2, size, busbw, True))
    for nodes, row in ARXIV.items():
        for mib, busbw in row.items():
            out.append(Point("arxiv", "h100-dgx", None, "allreduce", 8 * nodes, 8, mib * MIB,
                             busbw, False))  # fmt: skip
    for nodes, row in GTC_NVLSTREE.items():  # net_congestion fitted on 4 and 16 nodes
        for mib, busbw in row.items():
            out.append(Point("gtc-nvlstree", "h100-dgx", None, "allreduce", 8 * nodes, 8,
                             mib * MIB, busbw, nodes <= 16, "nvls_tree"))  # fmt: skip
    for profile, n, rpn, busbw in GTC:
        out.append(Point("gtc", profile, None, "allreduce", n, rpn, 16 * GIB, busbw, False))
    for size, us in NCCL1244:
        busbw = size / (us * 1e-6) / 1e9 * bus_factor("allreduce", 16)
        out.append(Point("nccl1244", "h100-dgx", "2.21.5", "allreduce", 16, 8, size, busbw,
                         False, "nvls_tree"))  # fmt: skip
    return out


_PROFILE_DIR = Path(tempfile.mkdtemp(prefix="cocoviz-validation-"))


@cache
def _hardware(profile: str, version: str | None, refit: bool = False) -> Hardware:
    """The shipped profile, or the same machine running another NCCL release; ``refit``:
    the profile `cocoviz calibrate` fits on the fit points (``refit_profiles``)."""
    text = refit_profiles().get((profile, _family(version)), "") if refit else ""
    if version is None and not text:
        return load_profile(profile)
    text = text or f'base = "{profile}"\nname = "{profile}-nccl{version}"\n'
    if version is not None:
        assert "[nccl]\n" not in text
        text += f'\n[nccl]\nversion = "{version}"\n'
    path = _PROFILE_DIR / f"{profile}-{version}-{'refit' if refit else 'shipped'}.toml"
    path.write_text(text)
    return load_profile(path)


def _sample(p: Point) -> Sample:
    seconds = p.nbytes * bus_factor(p.coll, p.nranks) / (p.busbw * 1e9)
    algos = (Algo(p.algo),) if p.algo else ()
    return Sample(Coll.parse(p.coll), p.nbytes, p.nranks, p.ranks_per_node, seconds, algos)


def _family(version: str | None) -> str:
    """Which refit a point is evaluated with: the 2.23 sweeps have their own (NCCL's LL
    and p2p changed between 2.23 and 2.29), every other point the shipped version's."""
    return "2.23" if version == "2.23" else ""


HELD = ("node.nvlink_link_gbps", "node.net_efficiency")
"""Fields the refit leaves at the shipped profile's value: NCCL's own link rates
(``SM90_NVLINK_BW``, ``NET_BW``), which its tuner ranks algorithms with; the measured
terms carry what the sweeps say beyond them."""


@cache
def refit_profiles() -> dict[tuple[str, str], str]:
    """What `cocoviz calibrate` makes of the refit's fit points (``Point.fitted``:
    every other size of the H100 and A100 sweeps at 2, 4 and 8 GPUs, every collective,
    the NVLSTree scan at 4 and 16 nodes, the li-plus pair) on the shipped profiles, one
    fit per machine and NCCL family (``_family``, as calibrate fits the logs of one
    release); H200 takes the H100 fit (the same GPU die and NVLink), as the shipped H200
    does, so every H200 point is held out. Profile override files (``base = ...``), by
    (shipped profile, family)."""
    fit = [p for p in points() if p.fitted and not p.blocking]
    out: dict[tuple[str, str], str] = {}
    for profile, bases in (("h100-dgx", ("h100-dgx", "h200-hgx")), ("a100-dgx", ("a100-dgx",))):
        for family in ("", "2.23"):
            mine = [
                _sample(p) for p in fit if p.profile == profile and _family(p.version) == family
            ]
            if not mine:
                continue
            base_hw = _hardware(profile, family or None)
            knobs = [k for k in knobs_for(base_hw) if k.field not in HELD]
            cal = fit_samples(mine, base_hw, knobs)
            for base in bases:
                out[base, family] = cal.profile_toml(name=f"{base}-refit", description="refit",
                                                     base_name=base)  # fmt: skip
    return out


def model_busbw(p: Point, refit: bool = False) -> float:
    """The model's nccl-tests busBw for a point (``blocking``: the host launch is exposed)."""
    hw = _hardware(p.profile, p.version, refit)
    cost = collective_time(hw, p.coll, p.nbytes, p.nranks, algo=p.algo,
                           ranks_per_node=p.ranks_per_node)  # fmt: skip
    seconds = cost.time_s + (cost.launch_s if p.blocking else 0.0)
    return p.nbytes / seconds / 1e9 * bus_factor(p.coll, cost.nranks)


def error(p: Point, refit: bool = False) -> float:
    return model_busbw(p, refit) / p.busbw - 1


def _nodes_class(n: int) -> str:
    return "1" if n == 1 else "2" if n == 2 else "4-16" if n <= 16 else "≥ 32"


def _size_class(nbytes: int) -> str:
    return "< 1 MiB" if nbytes < MIB else "1-64 MiB" if nbytes <= 64 * MIB else "> 64 MiB"


_SIZE_ORDER = {"< 1 MiB": 0, "1-64 MiB": 1, "> 64 MiB": 2}
_NODE_ORDER = {"1": 0, "2": 1, "4-16": 2, "≥ 32": 3}


def buckets(
    pts: list[Point], refit: bool = False
) -> dict[tuple[str, str, str], list[tuple[Point, float]]]:
    out: dict[tuple[str, str, str], list[tuple[Point, float]]] = {}
    for p in pts:
        key = (_nodes_class(p.nnodes), _size_class(p.nbytes), p.coll)
        out.setdefault(key, []).append((p, error(p, refit)))
    return dict(
        sorted(out.items(), key=lambda kv: (_NODE_ORDER[kv[0][0]], _SIZE_ORDER[kv[0][1]], kv[0][2]))
    )


def validation_table(pts: list[Point] | None = None, refit: bool = False) -> str:
    """The markdown table of docs/cost-model.md: per bucket, the number of points (fit /
    held out), the median and largest |error| (all points, then held-out points only)
    and how many errors are optimistic."""
    lines = [
        "| nodes | size | collective | points (fit / held out) | median | max | "
        "held-out median | held-out max | optimistic |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (nodes, size, coll), rows in buckets(points() if pts is None else pts, refit).items():
        errs = [abs(e) for _, e in rows]
        held = [abs(e) for p, e in rows if not p.fitted]
        fit = len(rows) - len(held)
        med_h = f"{statistics.median(held):.1%}" if held else "—"
        max_h = f"{max(held):.1%}" if held else "—"
        lines.append(
            f"| {nodes} | {size} | {coll} | {len(rows)} ({fit} / {len(held)}) | "
            f"{statistics.median(errs):.1%} | {max(errs):.1%} | {med_h} | {max_h} | "
            f"{sum(e > 0 for _, e in rows)} of {len(rows)} |"
        )
    return "\n".join(lines)


def measured_us(p: Point) -> float:
    """The point's measured time, µs (nccl-tests' busBw back to its time)."""
    return p.nbytes * bus_factor(p.coll, p.nranks) / (p.busbw * 1e3)


def _runs(pts: list[Point]) -> list[list[tuple[Point, CollCost]]]:
    """The one-node published sweeps, each cut into its runs of one algorithm and protocol
    (NCCL's choice as the model reads it: its tuner, its p2p plan), in size order, each
    point with the model's cost."""
    sweeps: dict[tuple[str, str | None, str, int], list[Point]] = {}
    for p in pts:
        if p.source == "aic" and p.nnodes == 1:
            sweeps.setdefault((p.profile, p.version, p.coll, p.nranks), []).append(p)
    runs: dict[tuple[object, ...], list[tuple[Point, CollCost]]] = {}
    for key, sweep in sweeps.items():
        hw = _hardware(key[0], key[1])
        for p in sorted(sweep, key=lambda p: p.nbytes):
            cost = collective_time(hw, p.coll, p.nbytes, p.nranks, ranks_per_node=p.ranks_per_node)
            runs.setdefault((*key, cost.algo, cost.proto), []).append((p, cost))
    return list(runs.values())


def floors(pts: list[Point] | None = None) -> dict[tuple[str, str], tuple[float, Point, Point]]:
    """Per one-node bucket below 64 MiB, the least max |error| that any model can reach if
    it does not price a larger call of a sweep faster than a smaller one on the same
    algorithm and protocol (as NCCL's does not, and this model does not:
    ``test_the_model_prices_a_larger_call_of_one_protocol_no_faster``): where a sweep took
    t₁ at a size and less, t₂, at a larger one of the same run, a model that gives both one
    time or a larger one for the larger size is off by at least (t₁ − t₂) / (t₁ + t₂) on one
    of them. (floor, the slower smaller point, the faster larger one) of the widest pair."""
    out: dict[tuple[str, str], tuple[float, Point, Point]] = {}
    for run in _runs(points() if pts is None else pts):
        for i, (a, _) in enumerate(run):
            for b, _ in run[i + 1 :]:
                size = _size_class(a.nbytes)
                if size != _size_class(b.nbytes) or size == "> 64 MiB":
                    continue
                ta, tb = measured_us(a), measured_us(b)
                floor = (ta - tb) / (ta + tb)
                if floor > out.get((size, a.coll), (0.0,))[0]:
                    out[size, a.coll] = (floor, a, b)
    return dict(sorted(out.items(), key=lambda kv: (_SIZE_ORDER[kv[0][0]], kv[0][1])))


def floor_table() -> str:
    """The markdown table of docs/cost-model.md ("What stays above the goal"): per one-node
    bucket below 64 MiB, the floor no model can go under (``floors``) and its pair."""
    lines = [
        "| size | collective | floor | sweep | algorithm | slower, smaller | faster, larger |",
        "|---|---|---|---|---|---|---|",
    ]
    for (size, coll), (floor, a, b) in floors().items():
        cost = collective_time(_hardware(a.profile, a.version), a.coll, a.nbytes, a.nranks)
        lines.append(
            f"| {size} | {coll} | {floor:.1%} | {a.profile} {a.version}, {a.nranks} GPUs | "
            f"{cost.algo.name}/{cost.proto.value} | {_size_label(a.nbytes)}: "
            f"{measured_us(a):.2f} µs | {_size_label(b.nbytes)}: {measured_us(b):.2f} µs |"
        )
    return "\n".join(lines)


DOCS = Path(__file__).resolve().parents[1] / "docs" / "cost-model.md"


def test_every_point_names_a_source_and_a_plausible_bandwidth():
    for p in points():
        assert p.source in SOURCES
        assert 0 < p.busbw < 1000, p


def test_docs_print_the_current_validation_tables():
    """docs/cost-model.md shows the tables this model gives, with the shipped profiles and
    with the profiles `cocoviz calibrate` fits on the fit points (regenerate with
    ``python tests/test_model_validation.py``)."""
    text = DOCS.read_text(encoding="utf-8")
    assert validation_table() in text
    assert validation_table(full_node(points())) in text


def test_docs_print_the_floor_table():
    """docs/cost-model.md shows the floors of the one-node buckets (``floors``)."""
    assert floor_table() in DOCS.read_text(encoding="utf-8")


def test_the_model_prices_a_larger_call_of_one_protocol_no_faster():
    """What makes ``floors`` a floor for this model: along every run of one algorithm and
    protocol of a published sweep, a larger call never takes less time (to 0.1%: a
    constant time may round down a hair as a channel is added)."""
    for run in _runs(points()):
        times = [cost.time_s for _, cost in run]
        assert all(b >= a * 0.999 for a, b in zip(times, times[1:], strict=False)), run[0][0]


def test_no_model_meets_the_max_goal_for_alltoall_below_1_mib():
    """Issue 27's max (≤ 25%) is out of any such model's reach in one bucket: H100, NCCL
    2.23, 8 GPUs, an LL alltoall of 64 KiB took 21.3 µs and one of 512 KiB 12.02 µs; the
    other buckets' floors are far below the goal, and every bucket's max is at least its
    floor (docs/cost-model.md, "What stays above the goal")."""
    table = buckets([p for p in points() if p.nnodes == 1])
    for (size, coll), (floor, a, b) in floors().items():
        assert max(abs(e) for _, e in table[("1", size, coll)]) >= floor - 1e-9
        if (size, coll) == ("< 1 MiB", "alltoall"):
            assert floor > 0.25
            assert (a.profile, a.version, a.nranks, a.nbytes, b.nbytes) == (
                "h100-dgx",
                "2.23",
                8,
                64 * KIB,
                512 * KIB,
            )
        else:
            assert floor < 0.15, (size, coll)


def full_node(pts: list[Point]) -> list[Point]:
    """One node, all 8 GPUs: the tensor-parallel groups cocoviz schedules."""
    return [p for p in pts if p.nnodes == 1 and p.nranks == 8]


@pytest.mark.parametrize("coll", ["allreduce", "allgather", "reducescatter"])
@pytest.mark.parametrize("size", ["< 1 MiB", "1-64 MiB"])
def test_full_node_small_and_mid_sizes_meet_the_goal_median(size, coll):
    """Issue 27's goal on one node (median |error| ≤ 10%), met on full 8-GPU nodes. The
    2- and 4-GPU communicators are not there yet (docs/cost-model.md)."""
    rows = buckets(full_node(points()))[("1", size, coll)]
    assert statistics.median(abs(e) for _, e in rows) <= 0.10


def test_multi_node_median_meets_the_goal():
    """Across nodes the median |error| is 6.3% (held out: 7.5%); goal 10%."""
    errs = [abs(error(p)) for p in points() if p.nnodes > 1]
    assert statistics.median(errs) <= 0.10


def test_the_measured_terms_close_the_multi_node_mid_sizes():
    """The profile calibrate fits (the network step, the tree fill, less congestion) on the
    NVLSTree scan at 4 and 16 nodes: held-out points across nodes at a median of 7.5%
    (shipped before the fit: 10.0%), and the 1-64 MiB scans of 4-16 and 32-512 nodes from
    20% and 52% to 7.5% and 12.9%."""
    multi = [p for p in points() if p.nnodes > 1]
    held = [abs(error(p)) for p in multi if not p.fitted]
    assert statistics.median(held) <= 0.08
    assert statistics.median(abs(error(p)) for p in multi) <= 0.10
    mid = buckets(
        multi,
    )
    for key, goal in ((("4-16", "1-64 MiB", "allreduce"), 0.10), (("≥ 32", "1-64 MiB", "allreduce"), 0.15)):  # fmt: skip
        assert statistics.median(abs(e) for _, e in mid[key]) <= goal, key


ONE_NODE_GOAL_COLLS = ("allgather", "allreduce", "alltoall", "reducescatter")


@pytest.mark.parametrize("coll", ONE_NODE_GOAL_COLLS)
@pytest.mark.parametrize("size", ["< 1 MiB", "1-64 MiB"])
def test_one_node_meets_the_goal_median(size, coll):
    """Issue 27's goal median (≤ 10%) on one node, every communicator size (2, 4 and 8
    GPUs) and collective, with the profiles calibrate fits on the refit's split — on all
    points, and on the held-out ones alone (docs/cost-model.md, Validation)."""
    rows = buckets(
        [p for p in points() if p.nnodes == 1],
    )[("1", size, coll)]
    assert statistics.median(abs(e) for _, e in rows) <= 0.10
    held = statistics.median(abs(e) for p, e in rows if not p.fitted)
    assert held <= 0.10


@pytest.mark.parametrize(
    ("size", "coll"),
    [
        ("< 1 MiB", "allreduce"),
        ("< 1 MiB", "reducescatter"),
        ("1-64 MiB", "allreduce"),
        ("1-64 MiB", "alltoall"),
        ("1-64 MiB", "reducescatter"),
    ],
)
def test_one_node_meets_the_max_goal_in_the_buckets_the_docs_name(size, coll):
    """The goal's max (≤ 25%) holds in these five one-node buckets only; docs/cost-model.md
    ("What stays above the goal") names the points that keep the others above it."""
    rows = buckets(
        [p for p in points() if p.nnodes == 1],
    )[("1", size, coll)]
    assert max(abs(e) for _, e in rows) <= 0.25


@pytest.mark.parametrize(
    ("profile", "family"), [("h100-dgx", ""), ("h100-dgx", "2.23"), ("a100-dgx", "")]
)
def test_the_shipped_profiles_are_calibrates_fit(profile: str, family: str) -> None:
    """The shipped measured terms (and H100's ``upto."2.23"`` ones) are what `cocoviz
    calibrate` fits on the refit's fit points, started from them: every term it moves
    stays within 10% (or 0.02 for a term that may be 0). A change to the model that moves
    the optimum fails here until the profiles are refitted (``refit_profiles``)."""
    shipped = _hardware(profile, family or None)
    refit = _hardware(profile, family or None, refit=True)
    for knob in knobs_for(shipped):
        if knob.field in HELD:
            continue
        a, b = knob.get(shipped), knob.get(refit)
        assert b == pytest.approx(a, rel=0.10, abs=0.0 if knob.log else 0.02), knob.field
    # the fit ran over the terms the sweeps inform (each written "# fit (base: ...)", moved
    # or not: started at its optimum, the fit moves few)
    text = refit_profiles()[profile, family]
    assert text.count("# fit (base:") >= 8


def test_nccls_p2p_plan_prices_the_ll_alltoalls_of_2_22_to_2_28():
    """From 2.22 to 2.28 NCCL runs a p2p message on LL up to 512 KiB a peer on the 8-GPU
    machines (docs/cost-model.md, AlltoAll): the alltoalls of 128-512 KiB a peer of the
    2.23 and 2.27.3 sweeps, which the model had priced as Simple (34-47% optimistic at
    4 MiB on 8 GPUs), are within 10% on 2, 4 and 8 GPUs, fitted and held out."""
    rows = [
        p
        for p in points()
        if p.coll == "alltoall"
        and p.version in ("2.23", "2.27.3")
        and 128 * KIB < p.nbytes // p.nranks <= 512 * KIB
    ]
    assert {p.nranks for p in rows} == {2, 4, 8} and len(rows) >= 12
    assert any(not p.fitted for p in rows)
    assert max(abs(error(p)) for p in rows) <= 0.10


def test_a_two_gpu_alltoall_runs_at_the_pairs_rate():
    """An alltoall of two GPUs is a send/recv pair (docs/cost-model.md, AlltoAll): from
    64 MiB the 2-GPU alltoalls of every sweep are within 10% (they were 1-15% optimistic
    at NCCL's 0.9 of the ring's rate, A100 the most)."""
    rows = [p for p in points() if p.coll == "alltoall" and p.nranks == 2 and p.nbytes >= 64 * MIB]
    assert len({(p.profile, p.version) for p in rows}) == 5 and len(rows) >= 20
    assert max(abs(error(p)) for p in rows) <= 0.10


def test_the_refit_split_holds_out_every_h200_point_and_every_other_size():
    """The refit's split (docs): fit on odd powers of two of the H100 and A100 sweeps, the
    NVLSTree scan at 4 and 16 nodes, the li-plus pair and the blocking H200 sweep (its
    launch term); every other H200 point, and every even power of two, is held out."""
    pts = points()
    fitted = [p for p in pts if p.fitted]
    assert all(p.profile != "h200-hgx" or p.source == "mle-h200" for p in fitted)
    assert all(_refit_size(p.nbytes) for p in fitted if p.source == "aic")
    held = [p for p in pts if not p.fitted]
    assert len(held) > len(fitted)
    assert {p.profile for p in held} == {"a100-dgx", "h100-dgx", "h200-hgx"}


def test_glitches_are_the_points_the_docs_list():
    """The rule of ``glitches`` leaves out only points over 1.5x slower than both their
    neighbours (a single point or an adjacent pair), and docs/cost-model.md lists each."""
    assert glitches([1.0, 2.0, 1.0]) == {1}
    assert glitches([1.0, 1.4, 1.0]) == set()
    assert glitches([1.0, 2.0, 2.1, 1.1]) == {1, 2}
    assert glitches([3.0, 1.0, 1.0]) == set()  # an end point is never judged
    text = DOCS.read_text(encoding="utf-8")
    excluded = excluded_points()
    assert 0 < len(excluded) <= 10
    for system, op, n, nbytes, us in excluded:
        assert f"| {system} | {op} | {n} | {_size_label(nbytes)} | {us:g} µs |" in text


def _size_label(nbytes: int) -> str:
    if nbytes < KIB:
        return f"{nbytes} B"
    return f"{nbytes >> 10} KiB" if nbytes < MIB else f"{nbytes >> 20} MiB"


def test_full_nodes_stay_within_the_goal_median():
    """On full 8-GPU nodes the refit keeps every allreduce/allgather/reducescatter bucket
    below 64 MiB near the goal median (3.3-7.8%; allgather below 1 MiB 6.9%)."""
    for (_, size, coll), rows in buckets(
        full_node(points()),
    ).items():
        if coll in ("allreduce", "allgather", "reducescatter") and size != "> 64 MiB":
            assert statistics.median(abs(e) for _, e in rows) <= 0.12, (size, coll)


def test_held_out_points_are_no_worse_than_fitted_ones_by_much():
    """The fit generalizes: the held-out full-node median is within 5 points of the fit's."""
    one = full_node(points())
    fit = statistics.median(abs(error(p)) for p in one if p.fitted)
    held = statistics.median(abs(error(p)) for p in one if not p.fitted)
    assert held <= fit + 0.05


def test_the_model_is_no_longer_systematically_optimistic_below_64_mib():
    """Before issue 27 most errors below 64 MiB on one node were optimistic."""
    errs = [error(p) for p in full_node(points()) if p.nbytes <= 64 * MIB]
    optimistic = sum(e > 0 for e in errs) / len(errs)
    assert 0.3 <= optimistic <= 0.7


if __name__ == "__main__":
    print("Left out as glitches:\n")
    print("| sweep | op | GPUs | size | time |\n|---|---|---|---|---|")
    for system, op, n, nbytes, us in excluded_points():
        print(f"| {system} | {op} | {n} | {_size_label(nbytes)} | {us:g} µs |")
    print("\nFloors:\n")
    print(floor_table())
    print("\nAll points:\n")
    print(validation_table())
    print("\nFull 8-GPU nodes:\n")
    print(validation_table(full_node(points())))
    print("\nRefit by calibrate, all points (test_the_shipped_profiles_are_calibrates_fit):\n")
    print(validation_table(refit=True))
