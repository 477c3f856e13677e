"""Reading the output of nccl-tests (``all_reduce_perf``, ``reduce_scatter_perf``,
``all_gather_perf``, ``alltoall_perf``, ``sendrecv_perf``) for ``cocoviz calibrate``.

``read_log(path) -> NcclTestsLog`` and ``parse_log(text, path) -> NcclTestsLog`` take one
run's output as nccl-tests prints it::

    # nccl-tests version 2.13.9 nccl-headers=22105 nccl-library=22105
    # Collective test starting: all_reduce_perf
    # nThread 1 nGpus 8 minBytes 8 maxBytes 8589934592 step: 2(factor) ...
    #  Rank  0 Group  0 Pid  1234 on  node-a device  0 [0x18] NVIDIA H100 80GB HBM3
    …
    #                                                   out-of-place                       in-place
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time ...
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us) ...
               8             2     float     sum      -1    15.30    0.00    0.00      0    15.08 ...
    …
    # Avg bus bandwidth    : 123.456

What it reads: the collective (the "Collective test starting" line, else the file's name,
else the busbw/algbw ratio where it is unambiguous), the ranks and nodes (the ``Rank``
lines: one per GPU, hosts counted by name), the GPU's name, the NCCL version
(``nccl-library=22105``, or an ``NCCL version 2.21.5`` line of NCCL_DEBUG=INFO), any
``NCCL_ALGO``/``NCCL_PROTO`` noted in the header (``NCCL_ALGO=Ring``, ``export
NCCL_PROTO=Simple``, NCCL's ``NCCL_ALGO set by environment to Tree``), both column groups
(out-of-place, in-place; ``N/A`` where nccl-tests has none) and old layouts (no ``root``
column, ``error`` for ``#wrong``). NCCL INFO/WARN lines interleaved with the table are
skipped.

What it refuses, as an ``InputError`` at ``file:line`` with the reason: a file with no
nccl-tests table, a column header without its units line, a row with missing columns or
a table that never reaches nccl-tests' ``# Avg bus bandwidth`` line (a truncated log), a
time that does not agree with size / algbw (not µs), a collective calibrate does not read
(``broadcast_perf``), and a second table in one log (one run per file: mixed collectives
or repeated runs are separate files). Every number of a row is checked where it is read:
size and count are plain non-negative integers (a size at most ``MAX_SIZE``), time,
algbw and busbw plain decimal numbers (no ``nan``, ``inf`` or sign), a time greater than
0 (and at most ``MAX_TIME_US``) wherever the size is (a row of size 0, which nccl-tests
prints for sizes that round down to no element, times nothing and is skipped) that gives
the printed algbw within its rounding, and the sizes never go down the
table (nccl-tests sweeps upward; rows of two runs pasted together do). A log of one rank
times no communication and is refused too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from cocoviz.errors import InputError, Source, Span, shown_value
from cocoviz.sim.collectives import Coll, bus_factor

__all__ = ["MAX_SIZE", "MAX_TIME_US", "TESTS", "LogRow", "NcclTestsLog", "parse_log", "read_log"]

MAX_SIZE = 1 << 50
"""The largest size a row may give, bytes (1 PiB: no buffer of a GPU comes near it)."""
MAX_TIME_US = 1e12
"""The longest time a row may give, µs (about 12 days)."""

_INTEGER = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
"""How nccl-tests prints its numbers (``%12li``, ``%7.2f``, ``%6.2e``): plain ASCII digits,
no sign (a negative time or bandwidth is not a measurement), no ``nan`` or ``inf``."""

TESTS: dict[str, Coll] = {
    "all_reduce_perf": Coll.ALLREDUCE,
    "reduce_scatter_perf": Coll.REDUCESCATTER,
    "all_gather_perf": Coll.ALLGATHER,
    "alltoall_perf": Coll.ALLTOALL,
    "sendrecv_perf": Coll.SENDRECV,
}
"""The nccl-tests binaries calibrate reads, and the collective each one times."""

_OTHER_TESTS = ("broadcast_perf", "reduce_perf", "gather_perf", "scatter_perf", "hypercube_perf")

_TYPES = {
    "int8": 1, "char": 1, "uint8": 1, "int32": 4, "int": 4, "uint32": 4, "int64": 8,
    "uint64": 8, "half": 2, "float16": 2, "float": 4, "float32": 4, "double": 8,
    "float64": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1,
}  # fmt: skip
"""nccl-tests' type names (``test_typenames`` in src/common.cu, old and new) and sizes."""


@dataclass(frozen=True, slots=True)
class LogRow:
    """One size of the sweep, one column group (out-of-place or in-place)."""

    line: int
    size: int
    """Bytes, nccl-tests' ``size`` (the full logical buffer the model prices)."""
    count: int
    type: str
    time_us: float
    algbw: float
    busbw: float


@dataclass(frozen=True)
class NcclTestsLog:
    """One nccl-tests run."""

    path: str
    test: str
    """The binary, ``all_reduce_perf``."""
    coll: Coll
    nranks: int
    nnodes: int
    gpu: str | None
    nccl_version: str | None
    algo: str | None
    """``NCCL_ALGO`` as the log notes it (``Ring``, ``NVLSTree``, ``^NVLS``), or None."""
    proto: str | None
    out_of_place: tuple[LogRow, ...]
    in_place: tuple[LogRow, ...]
    """Rows where nccl-tests printed an in-place time (alltoall has none in some releases)."""
    source: Source

    @property
    def ranks_per_node(self) -> int:
        return -(-self.nranks // self.nnodes)

    def rows(self, in_place: bool = False) -> tuple[LogRow, ...]:
        return self.in_place if in_place else self.out_of_place

    def describe(self) -> str:
        nodes = f"{self.nnodes} node{'s' if self.nnodes != 1 else ''}"
        extra = [f"NCCL {self.nccl_version}"] if self.nccl_version else []
        extra += [f"NCCL_ALGO={self.algo}"] if self.algo else []
        extra += [f"NCCL_PROTO={self.proto}"] if self.proto else []
        tail = f", {', '.join(extra)}" if extra else ""
        return f"{self.test}: {self.nranks} ranks on {nodes}{tail}"


def read_log(path: str | Path) -> NcclTestsLog:
    """Parse one log file; an unreadable file is an ``InputError`` naming it."""
    from cocoviz.fsio import read_text

    return parse_log(read_text(path, "nccl-tests log"), str(path))


_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*)$"
)
_STARTING = re.compile(r"Collective test starting:\s*(\S+)")
_LIBRARY = re.compile(r"nccl-library=(\d+)")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_ENV = {
    "NCCL_ALGO": re.compile(r"NCCL_ALGO(?:\s*=\s*|\s+set by environment to\s+)([^\s\"']+)"),
    "NCCL_PROTO": re.compile(r"NCCL_PROTO(?:\s*=\s*|\s+set by environment to\s+)([^\s\"']+)"),
}
_NOISE = re.compile(r"NCCL (?:INFO|WARN)|\bNCCL_DEBUG\b")
_NUMBER_COLUMNS = ("time", "algbw", "busbw")


class _Reader:
    """One pass over the lines of a log."""

    def __init__(self, text: str, path: str):
        self.source = Source(path, text)
        self.path = path

    def error(
        self,
        line: int,
        message: str,
        hint: str | None = None,
        needle: str | None = None,
        field: int | None = None,
    ) -> InputError:
        """An error at ``line``: under its ``field``-th whitespace-separated field, else
        under ``needle`` where the line holds it, else under the whole line."""
        text = self.source.line(line)
        spans = [m.span() for m in re.finditer(r"\S+", text)] if field is not None else []
        if field is not None and field < len(spans):
            start, end = spans[field][0] + 1, spans[field][1] + 1
        elif needle and needle in text:
            start = text.index(needle) + 1
            end = start + len(needle)
        else:
            start = len(text) - len(text.lstrip()) + 1 if text.strip() else 1
            end = max(len(text) + 1, start + 1)
        return InputError(message, Span(self.source, line, start, line, end), hint=hint)


def parse_log(text: str, path: str = "<log>") -> NcclTestsLog:
    """One nccl-tests run's output (see the module docstring); ``path`` names it in errors."""
    r = _Reader(text, path)
    lines = r.source.lines
    tests: list[tuple[int, str]] = []
    ranks: dict[int, tuple[str, str]] = {}
    version: str | None = None
    env: dict[str, tuple[int, str]] = {}
    tables: list[tuple[int, list[str]]] = []  # header line number, column names
    for no, line in enumerate(lines, 1):
        if m := _STARTING.search(line):
            tests.append((no, m.group(1)))
        if m := _RANK.match(line.strip()):
            ranks.setdefault(int(m.group(1)), (m.group(2), m.group(3).strip()))
        if m := _LIBRARY.search(line):
            version = _library_version(int(m.group(1)[:9])) or version
        elif version is None and (m := _VERSION.search(line)):
            version = m.group(1)
        for name, pattern in _ENV.items():
            if m := pattern.search(line):
                value = m.group(1).rstrip(",;")
                if name in env and env[name][1].lower() != value.lower():
                    raise r.error(
                        no,
                        f"{name} is noted twice with different values ({env[name][1]} at line "
                        f"{env[name][0]}, {value} here)",
                        hint="a log holds one nccl-tests run",
                        needle=name,
                    )
                env[name] = (no, value)
        if (columns := _header_columns(line)) is not None:
            tables.append((no, columns))
    if not tables:
        raise r.error(
            1,
            "not an nccl-tests log: no table header ('#  size  count  type  redop ... time "
            "algbw  busbw') in it",
            hint="give the output of all_reduce_perf, reduce_scatter_perf, all_gather_perf, "
            "alltoall_perf or sendrecv_perf",
        )
    test = _test_name(r, tests, tables)
    header_no, columns = tables[0]
    rows_out, rows_in, end = _table(r, header_no, columns)
    if len(tables) > 1:
        second = tables[1][0]
        later = [name for no, name in tests if no > end]
        what = (
            f"mixed collectives: a {later[0]} table after the {test} one"
            if later and later[0] != test
            else "a second table"
        )
        raise r.error(
            second,
            f"{what}; a log holds one nccl-tests run",
            hint="split the file: one run (one collective, one rank count) per log",
        )
    if not rows_out:
        raise r.error(header_no, "the table has no rows")
    coll = TESTS[test] if test in TESTS else _from_ratio(r, rows_out, header_no, test)
    test = test if test in TESTS else next(t for t, c in TESTS.items() if c is coll)
    nranks, nnodes = _ranks(r, ranks, rows_out, coll, header_no)
    gpu = ranks[min(ranks)][1] if ranks else None
    return NcclTestsLog(
        path=path,
        test=test,
        coll=coll,
        nranks=nranks,
        nnodes=nnodes,
        gpu=gpu or None,
        nccl_version=version,
        algo=env["NCCL_ALGO"][1] if "NCCL_ALGO" in env else None,
        proto=env["NCCL_PROTO"][1] if "NCCL_PROTO" in env else None,
        out_of_place=tuple(rows_out),
        in_place=tuple(rows_in),
        source=r.source,
    )


def _library_version(code: int) -> str | None:
    """``nccl-library=22105`` → ``2.21.5`` (NCCL_VERSION_CODE: X·10000 + Y·100 + Z since 2.9)."""
    if code >= 100000:  # not a code NCCL has written (its major release is 2)
        return None
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    if code >= 2000:  # X·1000 + Y·100 + Z before 2.9
        return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
    return None


def _header_columns(line: str) -> list[str] | None:
    """The column names of a table header line, or None for any other line."""
    s = line.strip()
    if not s.startswith("#"):
        return None
    names = s.lstrip("#").split()
    if len(names) < 6 or names[:2] != ["size", "count"] or "time" not in names:
        return None
    return names


def _test_name(
    r: _Reader, tests: list[tuple[int, str]], tables: list[tuple[int, list[str]]]
) -> str:
    """The binary that wrote the log: its "Collective test starting" line, else the file's
    name; "" when neither tells (the table's ratio decides then)."""
    first_table = tables[0][0]
    named = [(no, t) for no, t in tests if no < first_table] or tests[:1]
    if named:
        no, name = named[-1]
        base = _binary(name)
        if base in _OTHER_TESTS or base not in TESTS:
            raise r.error(
                no,
                f"calibrate reads all_reduce_perf, reduce_scatter_perf, all_gather_perf, "
                f"alltoall_perf and sendrecv_perf, not {name}",
                needle=name,
            )
        return base
    stem = Path(r.path).name.lower()
    for name in (*TESTS, *_OTHER_TESTS):
        if name in stem or name.removesuffix("_perf") in stem:
            if name in _OTHER_TESTS:
                raise r.error(
                    first_table,
                    f"the file's name says {name}; calibrate reads all_reduce_perf, "
                    "reduce_scatter_perf, all_gather_perf, alltoall_perf and sendrecv_perf",
                )
            return name
    return ""


def _binary(name: str) -> str:
    base = Path(name).name
    return base.removesuffix("_mpi")


def _table(
    r: _Reader, header_no: int, columns: list[str]
) -> tuple[list[LogRow], list[LogRow], int]:
    """The rows of the table whose header is at ``header_no``: (out-of-place, in-place,
    the line of its ``# Avg bus bandwidth``)."""
    lines = r.source.lines
    units_no = header_no + 1
    units = lines[units_no - 1] if units_no <= len(lines) else ""
    if not (
        units.lstrip().startswith("#") and "(B)" in units and "(us)" in units and "(GB/s)" in units
    ):
        raise r.error(
            header_no,
            "units missing: the column header is not followed by nccl-tests' units line "
            "('(B)  (elements)  (us)  (GB/s)  (GB/s)'), so the time column's unit is unknown",
            hint="keep the two header lines of the table as nccl-tests prints them",
        )
    index = {name: i for i, name in enumerate(columns) if name not in _NUMBER_COLUMNS}
    times = [i for i, name in enumerate(columns) if name == "time"]
    groups = [(t, t + 1, t + 2) for t in times if columns[t + 1 : t + 3] == ["algbw", "busbw"]]
    if not groups or "type" not in index:
        raise r.error(header_no, f"unexpected columns {' '.join(columns)}")
    width = len(columns)
    out: list[LogRow] = []
    inp: list[LogRow] = []
    previous_size, previous_line = 0, 0
    for no in range(units_no + 1, len(lines) + 1):
        line = lines[no - 1]
        s = line.strip()
        if not s or _NOISE.search(s):
            continue
        if s.startswith("#"):
            if "Avg bus bandwidth" in s:
                return out, inp, no
            if "Out of bounds" in s or s == "#":
                continue
            raise r.error(
                no,
                "the table stops before nccl-tests' '# Avg bus bandwidth' line: a truncated "
                "log, or two runs written into one file",
            )
        fields = s.split()
        if len(fields) != width:
            raise r.error(
                no,
                f"truncated row: {len(fields)} columns where the header has {width}",
                hint="the log was cut off or lines were joined; rerun or remove the row",
            )
        row_type = fields[index["type"]]
        if row_type not in _TYPES:
            raise r.error(
                no,
                f"unknown data type {_shown(row_type)} in the type column",
                hint=f"nccl-tests' types: {', '.join(_TYPES)}",
                field=index["type"],
            )
        for name in ("size", "count"):
            text = fields[index[name]]
            if not _INTEGER.fullmatch(text):
                raise r.error(
                    no,
                    f"the {name} must be a non-negative integer, got {_shown(text)}",
                    hint="calibrate reads nccl-tests' own columns; do not edit them",
                    field=index[name],
                )
            if len(text) > 16 or int(text) > MAX_SIZE:
                raise r.error(
                    no,
                    f"{name} {_shown(text)} is out of range (at most {MAX_SIZE:,})",
                    hint="calibrate reads nccl-tests' own columns; do not edit them",
                    field=index[name],
                )
        size, count = int(fields[index["size"]]), int(fields[index["count"]])
        if size < previous_size:
            raise r.error(
                no,
                f"the sizes go down: {size} B after {previous_size} B at line {previous_line}; "
                "nccl-tests sweeps sizes upward",
                hint="a log holds one nccl-tests run: put each run in its own file",
                field=index["size"],
            )
        previous_size, previous_line = size, no
        for g, group in enumerate(groups):
            values = [fields[i] for i in group]
            if any(v.upper() == "N/A" for v in values):
                if g == 0:
                    raise r.error(no, "no out-of-place time in this row")
                continue
            bad = next((i for i in group if not _DECIMAL.fullmatch(fields[i])), None)
            if bad is not None:
                raise r.error(
                    no,
                    f"{columns[bad]} {_shown(fields[bad])} is not a number nccl-tests prints "
                    "(a non-negative decimal)",
                    hint="calibrate reads nccl-tests' own columns; do not edit them",
                    field=bad,
                )
            time_us, algbw, busbw = (float(v) for v in values)
            if size == 0:
                continue  # nothing moved, nothing to fit
            if not (0 < time_us <= MAX_TIME_US) or not (
                math.isfinite(algbw) and math.isfinite(busbw)
            ):
                raise r.error(
                    no,
                    f"time {_shown(values[0])} µs for {size} B is out of range (greater than 0, "
                    f"at most {MAX_TIME_US:g} µs)",
                    hint="calibrate reads nccl-tests' own columns; do not edit them",
                    field=group[0],
                )
            if abs(size / time_us / 1e3 - algbw) > max(0.1 * algbw, 0.006):
                raise r.error(
                    no,
                    f"time {time_us:g} does not give algbw {algbw:g} for {size} B: the time "
                    "column is not in µs",
                    hint="calibrate reads nccl-tests' own columns; do not rescale them",
                    field=group[0],
                )
            (out if g == 0 else inp).append(
                LogRow(no, size, count, row_type, time_us, algbw, busbw)
            )
    raise r.error(
        len(lines) if lines[-1].strip() or len(lines) == 1 else len(lines) - 1,
        "the log ends inside the table (no '# Avg bus bandwidth' line): truncated?",
        hint="rerun the test, or give the whole output",
    )


def _shown(text: str) -> str:
    """A field of the log as a message quotes it (shortened when long)."""
    return repr(shown_value(text, 30))


def _ratio(rows: list[LogRow]) -> float | None:
    """busbw / algbw of the rows where both are large enough to read."""
    ratios = sorted(r.busbw / r.algbw for r in rows if r.algbw >= 1.0)
    return ratios[len(ratios) // 2] if ratios else None


def _from_ratio(r: _Reader, rows: list[LogRow], header_no: int, named: str) -> Coll:
    """The collective, when no line names it: the busbw/algbw ratio nccl-tests applies
    (2(n−1)/n allreduce, (n−1)/n reduce-scatter/allgather/alltoall, 1 sendrecv)."""
    ratio = _ratio(rows)
    hint = (
        "name the file after the binary (all_gather_perf.log) or keep nccl-tests' "
        "'# Collective test starting:' line"
    )
    if ratio is None:
        raise r.error(header_no, "cannot tell which nccl-tests binary wrote this log", hint=hint)
    if abs(ratio - 1) < 0.01:
        return Coll.SENDRECV
    if ratio > 1.01:
        return Coll.ALLREDUCE
    raise r.error(
        header_no,
        f"cannot tell which nccl-tests binary wrote this log: busbw/algbw = {ratio:.3f} fits "
        "reduce_scatter_perf, all_gather_perf and alltoall_perf alike",
        hint=hint,
    )


def _ranks(
    r: _Reader, ranks: dict[int, tuple[str, str]], rows: list[LogRow], coll: Coll, header_no: int
) -> tuple[int, int]:
    """(ranks, nodes): from the Rank lines; checked against the busbw/algbw ratio."""
    ratio = _ratio(rows)
    from_ratio: int | None = None
    if ratio is not None and coll is not Coll.SENDRECV:
        if coll is Coll.ALLREDUCE and ratio < 2:
            from_ratio = round(2 / (2 - ratio))
        elif coll is not Coll.ALLREDUCE and ratio < 1:
            from_ratio = round(1 / (1 - ratio))
    if ranks:
        n = len(ranks)
        if n < 2:
            raise r.error(
                header_no,
                "the log lists one rank: a collective on one GPU moves nothing over a link",
                hint="calibrate fits links: give logs of 2 or more GPUs (nccl-tests -g 2, or "
                "several MPI ranks)",
            )
        if from_ratio is not None and abs(bus_factor(coll, n) - (ratio or 0)) > 0.02:
            raise r.error(
                header_no,
                f"the table's busbw/algbw ({ratio:.3f}) is not {coll.value}'s on the {n} ranks "
                "the log lists",
                hint="a table of another collective or rank count was pasted under this header",
            )
        return n, len({host for host, _ in ranks.values()})
    if from_ratio is None or from_ratio < 2:
        raise r.error(
            header_no,
            "cannot tell the rank count: the log has no '#  Rank  N ... on HOST device' lines",
            hint="keep the 'Using devices' lines nccl-tests prints",
        )
    return from_ratio, 1
