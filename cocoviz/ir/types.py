"""Element types, sizes, shapes and layouts of the IR.

`DType` is the one table of dtype facts (docs/semantics-notes.md, the rules): its size, its
compute type, and how numpy, C++, CUDA, NCCL, MPI, cuBLAS and `.npy` spell it. The
simulator, the executors and the emitters read these facts from here; adding a dtype is a
member of `DType` and a row of `_FACTS` (plus its rounding rules in the numerics and the
runtime headers).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class DTypeFacts:
    """Everything the layers spell differently for one dtype."""

    itemsize: int
    """Bytes per element in C/CUDA storage and on the wire (2 for bf16)."""
    is_float: bool
    is_half: bool
    """f16/bf16: stored in 16 bits, computed in f32."""
    compute: str
    """DSL spelling of the dtype arithmetic runs in (f32 for f16/bf16/f32, f64, i64)."""
    numpy: str
    """numpy dtype holding values (bf16: float32 holding bf16-rounded values)."""
    cpu_ctype: str
    """C++ storage type on the CPU target (f16/bf16 are uint16_t bit patterns)."""
    cpu_compute_ctype: str
    cuda_ctype: str
    """CUDA storage type (``__half``, ``__nv_bfloat16``, ...)."""
    cuda_compute_ctype: str
    nccl: str
    """NCCL datatype enum."""
    nccl_tests: str
    """nccl-tests' name of the type (its ``-d`` flag and its table's ``type`` column)."""
    mpi: str
    """MPI datatype used for transport (f16/bf16 travel as MPI_UINT16_T with user ops)."""
    cuda_datatype: str
    """cudaDataType_t for cuBLAS (integers have no GEMM support and map to *_32I/*_64I)."""
    npy_descr: str
    """``.npy`` descr of saved arrays (bf16 is saved as float32)."""


class DType(enum.Enum):
    """Element types; `.value` is the DSL spelling, `.facts` the rest."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    I32 = "i32"
    I64 = "i64"

    # Members are singletons compared by identity: the identity hash is equivalent to
    # Enum's Python-level one and cheaper (dtypes key tables looked up at every node).
    __hash__ = object.__hash__

    @property
    def facts(self) -> DTypeFacts:
        return _FACTS[self]

    @property
    def is_float(self) -> bool:
        return self.facts.is_float

    @property
    def is_half(self) -> bool:
        return self.facts.is_half

    @property
    def itemsize(self) -> int:
        return self.facts.itemsize

    @property
    def compute(self) -> DType:
        """The dtype arithmetic runs in (docs/semantics-notes.md)."""
        return DType(self.facts.compute)

    @property
    def reduction_dtype(self) -> DType:
        """The dtype of `sum`/`norm`/`amax` of a tensor of this dtype."""
        return DType.F32 if self.is_half else self

    @property
    def runtime_enum(self) -> str:
        """The `cocoviz::DType` enumerator of the C++/CUDA runtime headers."""
        return f"cocoviz::DType::{self.value}"

    @staticmethod
    def parse(text: str) -> DType | None:
        return _DTYPE_BY_NAME.get(text)


_FACTS: dict[DType, DTypeFacts] = {
    DType.F16: DTypeFacts(
        2, True, True, "f32", "float16", "uint16_t", "float", "__half", "float",
        "ncclFloat16", "half", "MPI_UINT16_T", "CUDA_R_16F", "<f2",
    ),
    DType.BF16: DTypeFacts(
        2, True, True, "f32", "float32", "uint16_t", "float", "__nv_bfloat16", "float",
        "ncclBfloat16", "bfloat16", "MPI_UINT16_T", "CUDA_R_16BF", "<f4",
    ),
    DType.F32: DTypeFacts(
        4, True, False, "f32", "float32", "float", "float", "float", "float",
        "ncclFloat32", "float", "MPI_FLOAT", "CUDA_R_32F", "<f4",
    ),
    DType.F64: DTypeFacts(
        8, True, False, "f64", "float64", "double", "double", "double", "double",
        "ncclFloat64", "double", "MPI_DOUBLE", "CUDA_R_64F", "<f8",
    ),
    DType.I32: DTypeFacts(
        4, False, False, "i64", "int32", "int32_t", "int64_t", "int32_t", "int64_t",
        "ncclInt32", "int32", "MPI_INT32_T", "CUDA_R_32I", "<i4",
    ),
    DType.I64: DTypeFacts(
        8, False, False, "i64", "int64", "int64_t", "int64_t", "int64_t", "int64_t",
        "ncclInt64", "int64", "MPI_INT64_T", "CUDA_R_64I", "<i8",
    ),
}  # fmt: skip
"""The dtype table (field order as in `DTypeFacts`)."""

DTYPE_NAMES = tuple(d.value for d in DType)
_DTYPE_BY_NAME = {d.value: d for d in DType}


@dataclass(frozen=True)
class Size:
    """One dimension: its source spelling (`H`, `4*H`, `8`) and its numeric value."""

    text: str
    value: int

    def __str__(self) -> str:
        return self.text


Shape = tuple[Size, ...]


def numel(shape: Shape) -> int:
    return math.prod(s.value for s in shape)


def shape_values(shape: Shape) -> tuple[int, ...]:
    return tuple([s.value for s in shape])  # a list first: cheaper than a generator


def format_shape(shape: Shape, numeric: bool = False) -> str:
    return "[" + ", ".join(str(s.value) if numeric else s.text for s in shape) + "]"


class LayoutKind(enum.Enum):
    REPLICATED = "replicated"
    LOCAL = "local"
    SLICED = "sliced"

    __hash__ = object.__hash__  # as DType's


@dataclass(frozen=True)
class Layout:
    """How a tensor is stored across the ranks of a group.

    `dim` is None for flat `sliced` (rank r holds the r-th contiguous chunk of the
    row-major flattening) and a non-negative dimension for `sliced(d)` in normal form
    (some dimension before d has extent > 1).
    """

    kind: LayoutKind
    dim: int | None = None

    # Cached in the instance's __dict__ (outside the fields: equality and hashing ignore
    # them): inference asks them several times per node, of a handful of layout objects.
    @cached_property
    def is_sliced(self) -> bool:
        return self.kind is LayoutKind.SLICED

    @cached_property
    def is_replicated(self) -> bool:
        return self.kind is LayoutKind.REPLICATED

    @cached_property
    def is_local(self) -> bool:
        return self.kind is LayoutKind.LOCAL

    def __str__(self) -> str:
        if self.kind is LayoutKind.SLICED and self.dim is not None:
            return f"sliced({self.dim})"
        return self.kind.value


REPLICATED = Layout(LayoutKind.REPLICATED)
LOCAL = Layout(LayoutKind.LOCAL)
FLAT = Layout(LayoutKind.SLICED)


def sliced(dim: int | None, shape: Shape) -> Layout:
    """`sliced(dim)` in normal form for `shape` (dim may be negative)."""
    if dim is None:
        return FLAT
    d = dim + len(shape) if dim < 0 else dim
    for s in shape[:d]:
        if s.value != 1:
            break
    else:
        return FLAT
    layout = _SLICED.get(d)
    if layout is None:
        layout = _SLICED[d] = Layout(LayoutKind.SLICED, d)
    return layout


_SLICED: dict[int, Layout] = {}
"""`sliced(d)` by d: layouts are values, so one object per dimension serves every tensor
(a large program declares thousands of sliced inputs)."""


def block_dim(layout: Layout, shape: Shape, group: int) -> int | None:
    """The dimension a sliced layout partitions in blocks, if it is a block partition.

    A flat layout is a block partition along its first non-unit dimension when that
    extent divides by the group size; otherwise (or for non-sliced layouts) None.
    """
    if not layout.is_sliced:
        return None
    if layout.dim is not None:
        return layout.dim
    for i, s in enumerate(shape):
        if s.value != 1:
            return i if s.value % group == 0 else None
    return None


@dataclass(frozen=True)
class Partition:
    """Which global elements each rank holds, comparable across operands."""

    flat: bool
    dim_from_end: int  # for block partitions: dimension index counted from the end (1 = last)


def rank_shape(ty: TensorType, group: int) -> list[int]:
    """The shape of one rank's array of a value of type `ty` in a group of `group` ranks:
    its block (`block_dim` divided by the group) when sliced, the whole shape otherwise."""
    shape = list(shape_values(ty.shape))
    d = block_dim(ty.layout, ty.shape, group)
    if d is not None:
        shape[d] //= group
    return shape


def partition(layout: Layout, shape: Shape, group: int) -> Partition | None:
    if not layout.is_sliced:
        return None
    d = block_dim(layout, shape, group)
    if d is None:
        return Partition(True, 0)
    return Partition(False, len(shape) - d)


def same_slicing(a: Layout, a_shape: Shape, b: Layout, b_shape: Shape, group: int) -> bool:
    """Whether every rank holds the same global elements of two sliced operands
    (compared after right-aligning broadcast dimensions)."""
    pa, pb = partition(a, a_shape, group), partition(b, b_shape, group)
    if pa is None or pb is None:
        return False
    if shape_values(a_shape) == shape_values(b_shape):
        if pa == pb:
            return True
        # A flat slicing equals a block slicing on the first non-unit dimension.
        return block_dim(a, a_shape, group) == block_dim(b, b_shape, group) is not None
    if pa.flat or pb.flat:
        return False
    return pa.dim_from_end == pb.dim_from_end


@dataclass(frozen=True, init=False)  # its __init__ is written by hand
class TensorType:
    """What a value is: element type, global shape, layout and pipeline stage."""

    dtype: DType
    shape: Shape
    layout: Layout
    pstage: int | None = 0  # None: on every pipeline stage (params, literals)
    dp: Layout = REPLICATED
    """The layout over the grid's dp axis, of each tp rank's part (docs/language.md,
    rank grids); replicated on a grid without dp."""

    def __init__(
        self,
        dtype: DType,
        shape: Shape,
        layout: Layout,
        pstage: int | None = 0,
        dp: Layout = REPLICATED,
    ) -> None:
        # inference types every node: as Span's, the fields go straight into __dict__,
        # at half the cost of the generated frozen __init__'s object.__setattr__ calls
        d = self.__dict__
        d["dtype"] = dtype
        d["shape"] = shape
        d["layout"] = layout
        d["pstage"] = pstage
        d["dp"] = dp

    @cached_property
    def numel(self) -> int:
        # kept in the instance's __dict__ (outside the fields: equality and hashing
        # ignore it); the simulator and the emitter ask for it again and again
        return numel(self.shape)

    @property
    def is_scalar(self) -> bool:
        return len(self.shape) == 0

    def __str__(self) -> str:
        over = "" if self.dp.is_replicated else " " + axis_layout_text(self.dp, "dp")
        return f"{self.dtype.value}{format_shape(self.shape)} {self.layout}{over}"


def layouts_text(ty: TensorType) -> str:
    """The layout over tp, and over dp where it is not replicated: `sliced(1) local(over=dp)`."""
    if ty.dp.is_replicated:
        return str(ty.layout)
    return f"{ty.layout} {axis_layout_text(ty.dp, 'dp')}"


def axis_layout_text(layout: Layout, axis: str) -> str:
    """A layout over a named axis as the source writes it: `sliced(1, over=dp)`."""
    if layout.is_sliced and layout.dim is not None:
        return f"sliced({layout.dim}, over={axis})"
    return f"{layout.kind.value}(over={axis})"


def tp_local_shape(shape: Shape, layout: Layout, group: int) -> Shape:
    """The shape of one tp rank's part of a value (a flat chunk that is no block of one
    dimension: 1-D), with spellings such as `F/4` for messages."""
    if not layout.is_sliced or group == 1:
        return shape
    d = block_dim(layout, shape, group)
    if d is None:
        n = numel(shape)
        return (Size(f"{n}/{group}", n // group),)
    s = shape[d]
    return shape[:d] + (Size(f"{s.text}/{group}", s.value // group),) + shape[d + 1 :]


def dp_view(ty: TensorType, group: int) -> TensorType:
    """The value as the dp axis sees it: each tp rank's part, laid out over dp
    (docs/language.md, rank grids: a dp layout describes a tp rank's part)."""
    return TensorType(ty.dtype, tp_local_shape(ty.shape, ty.layout, group), ty.dp, ty.pstage)
