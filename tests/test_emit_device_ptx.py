"""The nccl-device kernel is built like NCCL's symmetric kernels (docs/codegen.md, the
nccl-device kernel), and its PTX shows it: compiled with ``nvcc -ptx`` for sm_90 (and
sm_100), the LSA variant moves peer data in 128-bit vector loads and stores (``ld.v4``
through the generic LSA pointers, ``st.global.v4``) — one per peer per unrolled pack — with
no volatile accesses, and the multimem variant reduces with ``multimem.ld_reduce`` and broadcasts with
``multimem.st``, and synchronises through the LSA barrier's multimem form as NCCL's NVLS
kernels do: its arrive is a ``multimem.red.release.sys`` through the multicast object
(NCCL's ``nccl_device/impl/lsa_barrier__funcs.h``), not the unicast form's
``fence.acq_rel.sys`` and peer stores, and a ``fence.proxy.alias`` orders the element-wise
path's unicast window accesses before it. No GPU is needed: nvcc only."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import need_tool
from emit_support import emit_files, need_nvcc, write

from cocoviz.emit.toolchain import find_toolchain

CASES = [("adam", "4", 4), ("megatron_mlp", "4", 4), ("sgd", "2", 2)]
"""(sample, ranks, peers): adam reduces f16 gradients into f32 weights, megatron_mlp
f16 activations, sgd f32 gradients."""

VECTOR = re.compile(r"\b((?:ld|st)(?:\.global)?(?:\.volatile)?\.v[24]\.[a-z0-9]+)")
MULTIMEM = re.compile(r"\b(multimem\.(?:ld_reduce|st)[\w.:]*)")
BARRIER = re.compile(r"\b(multimem\.red\.[\w.:]+|fence\.[\w.:]+)")


def ptx(name: str, ranks: str, arch: str, tmp: Path) -> dict[str, str]:
    """The PTX of the scheduled program's device-API kernels, by kernel name."""
    files = emit_files(name, "fused", "cuda", "nccl-device", ranks=ranks)
    write(tmp, files)
    tc = find_toolchain()
    assert tc.cuda is not None
    out = tmp / f"{name}.ptx"
    cmd = [str(tc.cuda.nvcc), *tc.nvcc_compile_args(arch), "-ptx", str(tmp / f"{name}.cu")]
    res = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "warning" not in res.stderr.lower(), res.stderr
    text = out.read_text()
    kernels = {}
    for m in re.finditer(r"\.entry\s+(\S+)\((.*?)\n\}\n", text, re.S):
        if "_device" in m.group(1) and "sch" in m.group(1):
            kernels[m.group(1)] = m.group(0)
    return kernels


@pytest.mark.parametrize(("name", "ranks", "peers"), CASES)
@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_device_kernel_ptx_has_vector_peer_accesses_and_multimem(
    name: str, ranks: str, peers: int, arch: str, tmp_path: Path
) -> None:
    need_nvcc()
    need_tool(find_toolchain().cuda.supports(arch), f"an nvcc that builds {arch}")  # type: ignore[union-attr]
    kernels = ptx(name, ranks, arch, tmp_path)
    lsa = [b for k, b in kernels.items() if "_mc" not in k]
    mc = [b for k, b in kernels.items() if "_mc" in k]
    assert len(lsa) == 1 and len(mc) == 1, sorted(kernels)
    body = lsa[0]
    vec = Counter(VECTOR.findall(body))
    # the peer loads are generic (LSA pointers), 16 bytes each, one per peer and unrolled
    # pack; the stores (st.global.v4, cocoviz_runtime.cuh's store_pack) one per peer and pack
    peer_loads = sum(n for op, n in vec.items() if op.startswith("ld.v4"))
    stores = sum(n for op, n in vec.items() if op.startswith("st.global.v4"))
    # (nvcc may keep the loop over the unrolled packs rolled: at least one per peer)
    assert peer_loads >= peers, vec
    assert stores >= peers, vec
    assert "volatile" not in body
    assert not MULTIMEM.findall(body)
    ops = Counter(MULTIMEM.findall(mc[0]))
    assert any(op.startswith("multimem.ld_reduce") and ".v4." in op for op in ops), ops
    assert any(op.startswith("multimem.st") and ".v4." in op for op in ops), ops
    # the multimem variant does not load packs from the peers one by one
    assert not any(op.startswith("ld.v4") for op in Counter(VECTOR.findall(mc[0]))), mc[0][:2000]
    # barriers: the LSA variant's arrive is the unicast form (fence.acq_rel.sys, no multicast
    # reduction); the multimem variant's goes through the multicast object — relaxed at the
    # start (NCCL's acquire sync), a release at the end — with the proxy fence before it
    lsa_bar = Counter(BARRIER.findall(body))
    mc_bar = Counter(BARRIER.findall(mc[0]))
    assert "fence.acq_rel.sys" in lsa_bar and not any(
        op.startswith("multimem.red") for op in lsa_bar
    )
    assert "multimem.red.release.sys.add.u32" in mc_bar, mc_bar
    assert "multimem.red.relaxed.sys.add.u32" in mc_bar, mc_bar
    assert "fence.proxy.alias" in mc_bar, mc_bar
    assert "fence.acq_rel.sys" not in mc_bar, mc_bar
