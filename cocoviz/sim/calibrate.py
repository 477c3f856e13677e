"""A hardware profile fitted to measurements: what ``cocoviz calibrate`` runs.

``calibrate(logs, base) -> Calibration`` fits the profile fields that the model's
collective times depend on to the times of nccl-tests logs (``nccl_tests_log``), starting
from ``base`` and moving only the fields the logs inform::

    link        node.nvlink_link_gbps (node.pci_gbps on a PCIe box)   large one-node sizes
                node.net_efficiency                                   large multi-node sizes
    latency     nccl.measured.base_latency_scale, hop_latency_scale   small sizes
                nccl.measured.net_hop_latency_us                      small multi-node sizes
    efficiency  nccl.measured.channel_gbps                            calls on few channels
                nccl.measured.ll_bw_scale                             the LL protocol's rate
                nccl.measured.ring_fill_mib / ring_fill_half_mib      ring and PAT mid sizes
                nccl.measured.nvls_fill_mib / nvls_fill_half_mib      NVLS mid sizes
                nccl.measured.net_fill_mib / net_fill_half_mib        trees across nodes
                nccl.measured.p2p_nvlink_efficiency                   send/recv, 2-rank rings, alltoalls
                nccl.measured.net_congestion                          3 and more nodes
                nccl.measured.p2p_latency_scale                       small alltoall, send/recv
                nccl.measured.ring_fill_steps                         rings of several lengths
                nccl.measured.p2p_ll_gbps                             alltoall/send/recv LL sizes
                nccl.measured.p2p_ll_peer_hops                        LL alltoall, several GPU counts

The fit is a damped Gauss-Newton (Levenberg-Marquardt) on log(model time / measured
time) over every logged size, with a soft-L1 weight (a noisy point counts less than a
trend) and a weak pull toward the base value of each field, so that a field the logs
barely inform stays where the base put it. A field is fitted only where the logs move the
model (some point's time changes by more than 1% when the field doubles); the others keep
the base's value and are listed as such. NCCL's own choice of algorithm and protocol is
kept (its tuning constants are the release's, ``nccl.version``, taken from the logs);
``NCCL_ALGO``/``NCCL_PROTO`` noted in a log restrict the choice for that log's points.

``Calibration.profile_toml()`` writes the result as a profile that starts from the base
(``base = "h100-dgx"``) and overrides the fitted fields, loadable with ``--hw FILE``;
``Calibration.residuals`` holds the per-size table that ``cocoviz calibrate`` prints.

``fit_samples(samples, base, knobs)`` is the same fit over plain ``Sample`` values (what
``cocoviz calibrate --local`` measures on this machine).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Protocol

import numpy as np

from cocoviz.errors import InputError, Span
from cocoviz.sim.collectives import (
    Algo,
    Coll,
    CollCost,
    CostModelError,
    Proto,
    bus_factor,
    collective_candidates,
)
from cocoviz.sim.hardware import (
    MIN_NUMBER,
    Hardware,
    Link,
    PerProto,
    list_profiles,
    nccl_tuning,
    parse_nccl_version,
)
from cocoviz.sim.nccl_tests_log import NcclTestsLog

__all__ = [
    "Calibration",
    "residual_table",
    "Knob",
    "Residual",
    "Sample",
    "base_for_gpu",
    "calibrate",
    "fit_samples",
    "knobs_for",
    "log_samples",
]

_MIB = float(1 << 20)

# ---------------------------------------------------------------------------------------
# Fields a fit may move


@dataclass(frozen=True)
class Knob:
    """One profile field a fit may move: its dotted TOML name, its range, and whether the
    fit moves it in log space (a rate or a scale) or linearly (a term that may be 0)."""

    field: str
    low: float
    high: float
    log: bool = True
    scale: float = 1.0
    """Linear knobs: the step that counts as one unit of change (a doubling for log knobs)."""
    start_when_unset: float | None = None
    """Where a fit starts a term whose 0 means "not measured, off"."""

    def start(self, hw: Hardware) -> float:
        """The value a fit starts from and is pulled toward (a 0 that means "off" cannot
        be moved in log space)."""
        value = self.get(hw)
        return self.start_when_unset if value == 0 and self.start_when_unset else value

    def get(self, hw: Hardware) -> float:
        value: object = hw
        for part in self.field.split("."):
            value = getattr(value, part)
        assert isinstance(value, int | float)
        return float(value)

    def set(self, hw: Hardware, value: float) -> Hardware:
        new = _replace_path(hw, self.field.split("."), value)
        assert isinstance(new, Hardware)
        return new

    def to_x(self, value: float) -> float:
        return math.log(value) if self.log else value / self.scale

    def from_x(self, x: float) -> float:
        value = math.exp(x) if self.log else x * self.scale
        value = min(self.high, max(self.low, value))
        if not self.log and self.low <= 0.0 and abs(value) < MIN_NUMBER:
            return 0.0  # a term this small is none (a profile's numbers start at MIN_NUMBER)
        return value


def _replace_path(obj: object, path: list[str], value: float) -> object:
    head, *rest = path
    new = value if not rest else _replace_path(getattr(obj, head), rest, value)
    return dataclasses.replace(obj, **{head: new})  # type: ignore[type-var]


def knobs_for(hw: Hardware) -> tuple[Knob, ...]:
    """The fields ``calibrate`` may fit on a profile (module docstring)."""
    link = "node.nvlink_link_gbps" if hw.node.intra_link is Link.NVLINK else "node.pci_gbps"
    rate = Knob(link, 1e-3, 1e4)
    return (
        rate,
        Knob("node.net_efficiency", 0.05, 1.0),
        Knob("nccl.measured.base_latency_scale.ll", 0.05, 20.0),
        Knob("nccl.measured.base_latency_scale.ll128", 0.05, 20.0),
        Knob("nccl.measured.base_latency_scale.simple", 0.05, 20.0),
        Knob("nccl.measured.hop_latency_scale", 0.05, 20.0),
        Knob("nccl.measured.net_hop_latency_us", 0.0, 500.0, log=False, scale=10.0),
        Knob("nccl.measured.channel_gbps", 0.5, 2000.0),
        Knob("nccl.measured.ll_bw_scale", 0.1, 4.0),
        Knob("nccl.measured.ring_fill_mib", 0.0, 8192.0, log=False, scale=50.0),
        Knob("nccl.measured.ring_fill_half_mib", 0.01, 1e5),
        Knob("nccl.measured.nvls_fill_mib", 0.0, 8192.0, log=False, scale=10.0),
        Knob("nccl.measured.nvls_fill_half_mib", 0.01, 1e5),
        Knob("nccl.measured.net_fill_mib", 0.0, 1024.0, log=False, scale=2.0),
        Knob("nccl.measured.net_fill_half_mib", 0.01, 1e5),
        Knob("nccl.measured.p2p_nvlink_efficiency", 0.05, 1.0),
        Knob("nccl.measured.net_congestion", 0.0, 0.5, log=False, scale=0.05),
        Knob("nccl.measured.p2p_latency_scale", 0.05, 20.0),
        Knob("nccl.measured.ring_fill_steps", 0.0, 4.0, log=False, scale=0.5),
        Knob("nccl.measured.p2p_ll_gbps", 0.5, 1000.0, start_when_unset=10.0),
        Knob("nccl.measured.p2p_ll_peer_hops", 0.0, 2.0, log=False, scale=0.25),
    )


# ---------------------------------------------------------------------------------------
# Samples: what a fit compares with


class Measured(Protocol):
    """Anything a fit compares with: a measured time and where it came from."""

    @property
    def time_s(self) -> float: ...

    @property
    def label(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured call: a collective of ``nbytes`` (nccl-tests' size) on ``nranks``."""

    coll: Coll
    nbytes: int
    nranks: int
    ranks_per_node: int
    time_s: float
    algos: tuple[Algo, ...] = ()
    """Allowed algorithms (a log's NCCL_ALGO); empty: NCCL's choice."""
    protos: tuple[Proto, ...] = ()
    label: str = ""
    """Where it came from (``all_reduce_perf.log:31``)."""

    @property
    def busbw(self) -> float:
        return self.nbytes / self.time_s / 1e9 * bus_factor(self.coll, self.nranks)


def model_cost(hw: Hardware, s: Sample) -> CollCost:
    """The model's cost of a sample: NCCL's cheapest choice among the allowed ones."""
    rpn = min(s.ranks_per_node, hw.gpus_per_node)
    for c in collective_candidates(hw, s.coll, s.nbytes, s.nranks, ranks_per_node=rpn):
        if (not s.algos or c.algo in s.algos) and (not s.protos or c.proto in s.protos):
            return c
    allowed = [a.value for a in s.algos] + [p.value for p in s.protos]
    raise CostModelError(
        f"{s.label}: the model has no {'/'.join(allowed)} for {s.coll.value} on {s.nranks} "
        f"ranks of {hw.name}"
    )


_NCCL_ALGO_NAMES = {
    "ring": (Algo.RING,),
    "tree": (Algo.TREE,),
    "nvls": (Algo.NVLS,),
    "nvlstree": (Algo.NVLS_TREE,),
    "pat": (Algo.PAT,),
    "collnetdirect": (),
    "collnetchain": (),
    "collnet": (),
}


def _restriction(log: NcclTestsLog, variable: str, text: str | None) -> str | None:
    """The part of an NCCL_ALGO / NCCL_PROTO value that applies to the log's collective
    (``allreduce:ring;allgather:ring,pat`` → the allreduce part); None when nothing
    restricts it. A part that names no collective (``:ring``) is an error."""
    if not text:
        return None
    if ":" not in text:
        return text
    for part in text.split(";"):
        if ":" in part:
            name, value = part.split(":", 1)
            if not name.strip():
                raise _log_error(
                    log,
                    variable,
                    f"{variable}={text}: the part {part.strip()!r} names no collective",
                )
            if name.strip().lower().replace("_", "") == log.coll.value:
                return value
    return None


def _names(log: NcclTestsLog, variable: str, value: str | None, text: str) -> list[str]:
    """The names of an NCCL_ALGO / NCCL_PROTO value (``^`` and spaces dropped); an error
    when it names none."""
    names = [n.strip().lower() for n in text.strip().lstrip("^").split(",") if n.strip()]
    if not names:
        raise _log_error(
            log,
            variable,
            f"{variable}={value} names no {'algorithm' if variable == 'NCCL_ALGO' else 'protocol'}"
            f" for {log.coll.value}",
        )
    return names


def _algos(log: NcclTestsLog) -> tuple[Algo, ...]:
    text = _restriction(log, "NCCL_ALGO", log.algo)
    if text is None or log.coll in (Coll.SENDRECV, Coll.ALLTOALL):
        return ()
    negate = text.strip().startswith("^")
    chosen: set[Algo] = set()
    for name in _names(log, "NCCL_ALGO", log.algo, text):
        if name not in _NCCL_ALGO_NAMES:
            raise _log_error(
                log, "NCCL_ALGO", f"unknown algorithm {name!r} in NCCL_ALGO={log.algo}"
            )
        chosen.update(_NCCL_ALGO_NAMES[name])
    if negate:
        chosen = {a for a in Algo if a not in chosen and a is not Algo.P2P}
        if not chosen - {Algo.SYMMETRIC}:
            raise _log_error(
                log, "NCCL_ALGO", f"NCCL_ALGO={log.algo} excludes every algorithm the model runs"
            )
    if not chosen:
        raise _log_error(
            log, "NCCL_ALGO", f"NCCL_ALGO={log.algo}: CollNet is not modelled (no network SHARP)"
        )
    return tuple(a for a in Algo if a in chosen)


def _protos(log: NcclTestsLog) -> tuple[Proto, ...]:
    text = _restriction(log, "NCCL_PROTO", log.proto)
    if text is None:
        return ()
    negate = text.strip().startswith("^")
    by_name = {p.value.lower(): p for p in Proto}
    chosen: set[Proto] = set()
    for name in _names(log, "NCCL_PROTO", log.proto, text):
        if name not in by_name:
            raise _log_error(
                log, "NCCL_PROTO", f"unknown protocol {name!r} in NCCL_PROTO={log.proto}"
            )
        chosen.add(by_name[name])
    if negate:
        chosen = set(Proto) - chosen
    if not chosen:
        raise _log_error(log, "NCCL_PROTO", f"NCCL_PROTO={log.proto} excludes every protocol")
    return tuple(p for p in Proto if p in chosen)


_HINTS = {
    "NCCL_ALGO": "NCCL_ALGO takes names among Ring, Tree, NVLS, NVLSTree, PAT, CollNetDirect "
    "and CollNetChain, a leading ^ to exclude them, or allreduce:ring;allgather:ring,pat",
    "NCCL_PROTO": "NCCL_PROTO takes names among LL, LL128 and Simple, a leading ^ to exclude "
    "them, or allreduce:Simple;allgather:LL128",
}


def _log_error(log: NcclTestsLog, needle: str, message: str) -> InputError:
    hint = _HINTS.get(needle)
    for no, line in enumerate(log.source.lines, 1):
        if needle in line:
            col = line.index(needle) + 1
            return InputError(message, Span(log.source, no, col, no, len(line) + 1), hint=hint)
    return InputError(f"{log.path}: {message}", hint=hint)


def log_samples(log: NcclTestsLog, *, in_place: bool = False) -> list[Sample]:
    """The points of one log: every size of the chosen column group."""
    algos, protos = _algos(log), _protos(log)
    name = log.path.rsplit("/", 1)[-1]
    return [
        Sample(
            log.coll,
            row.size,
            log.nranks,
            log.ranks_per_node,
            row.time_us * 1e-6,
            algos,
            protos,
            f"{name}:{row.line}",
        )
        for row in log.rows(in_place)
    ]


# ---------------------------------------------------------------------------------------
# The fit


@dataclass(frozen=True, slots=True)
class Residual:
    """One point after the fit."""

    sample: Measured
    model_time_s: float
    label: str
    """The model's algorithm/protocol."""

    @property
    def model_busbw(self) -> float:
        s = self.sample
        assert isinstance(s, Sample)
        return s.nbytes / self.model_time_s / 1e9 * bus_factor(s.coll, s.nranks)

    @property
    def error(self) -> float:
        """model busBw / measured busBw − 1 (positive: the model is optimistic)."""
        return self.sample.time_s / self.model_time_s - 1


@dataclass(frozen=True)
class Calibration:
    """A fitted profile and how well it fits."""

    base: Hardware
    hardware: Hardware
    fitted: tuple[tuple[Knob, float, float], ...]
    """(field, base value, fitted value) of every field the samples informed."""
    kept: tuple[Knob, ...]
    """Fields the samples do not inform: the base's value stays."""
    before: tuple[Residual, ...]
    residuals: tuple[Residual, ...]
    logs: tuple[NcclTestsLog, ...] = ()
    set_fields: tuple[tuple[str, object], ...] = ()
    """Fields set from the logs rather than fitted (``nccl.version``)."""
    notes: tuple[str, ...] = ()
    """What the fit could not take from the logs (an NCCL release the model does not
    tabulate), for the user to see."""

    def summary(self, after: bool = True) -> tuple[float, float]:
        """(median, max) |error| over the points."""
        errs = [abs(r.error) for r in (self.residuals if after else self.before)]
        return (statistics.median(errs), max(errs)) if errs else (0.0, 0.0)

    def profile_toml(self, *, name: str, description: str, base_name: str) -> str:
        """A profile file: ``base = base_name`` and the fitted fields (with comments)."""
        med, worst = self.summary()
        med0, worst0 = self.summary(after=False)
        lines = [
            "# Written by `cocoviz calibrate` from:",
            *(f"#   {printable(log.path)}  ({printable(log.describe())})" for log in self.logs),
            *(f"# note: {printable(note)}" for note in self.notes),
            f"# busBw error over {len(self.residuals)} points: median {med:.1%}, max {worst:.1%} "
            f"(the base profile: median {med0:.1%}, max {worst0:.1%}).",
            "# Fields the logs do not inform keep the base's value: "
            + (", ".join(k.field for k in self.kept) or "none")
            + ".",
            "",
            f'base = "{base_name}"',
            f"name = {toml_str(name)}",
            f"description = {toml_str(description)}",
        ]
        tables: dict[str, list[str]] = {}
        for field, value in self.set_fields:
            table, key = field.rsplit(".", 1)
            tables.setdefault(table, []).append(
                f"{key} = {_toml_value(value)}  # from the logs (base: "
                f"{_toml_value(_get(self.base, field))})"
            )
        written: set[str] = set()
        for knob, _, _ in self.fitted:
            field = knob.field
            parent = field.rsplit(".", 1)[0]
            if isinstance(_get(self.hardware, parent), PerProto):
                field = parent  # one list [LL, LL128, Simple]
            if field in written:
                continue
            written.add(field)
            table, key = field.rsplit(".", 1)
            new, old = _toml_value(_get(self.hardware, field)), _toml_value(_get(self.base, field))
            tables.setdefault(table, []).append(f"{key} = {new}  # fit (base: {old})")
        for table in sorted(tables, key=lambda t: (t.count("."), t)):
            lines += ["", f"[{table}]", *tables[table]]
        return "\n".join(lines) + "\n"


def _get(hw: Hardware, field: str) -> object:
    value: object = hw
    for part in field.split("."):
        value = getattr(value, part)
    return value


def _fmt(value: float) -> str:
    return f"{value:.4g}" if value != 0 else "0.0"


def _toml_value(value: object) -> str:
    if isinstance(value, PerProto):
        return f"[{_fmt(value.ll)}, {_fmt(value.ll128)}, {_fmt(value.simple)}]"
    if isinstance(value, str):
        return toml_str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _fmt(value)
    return str(value)


def toml_str(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def printable(text: str) -> str:
    """``text`` with every character a terminal or a TOML comment must not hold (control
    characters, an undecodable byte of a file name) shown as ``?``."""
    return "".join(c if c.isprintable() else "?" for c in text)


_IDS = count()
_PRIOR = 0.01
"""Weight of the pull toward the base value, per unit of a knob (a doubling)."""
_SOFT = 0.1
"""Scale of the soft-L1 weight: a point 10% off counts fully, one 40% off about half."""
_COVERED = 0.01
"""A knob is fitted when some point's log time moves more than this per unit of it."""


def _variant(hw: Hardware) -> Hardware:
    # A distinct (name, source) per trial keeps the memoized model's hash buckets apart.
    return dataclasses.replace(hw, source=f"<calibrate {next(_IDS)}>")


def _times(
    hw: Hardware, samples: Sequence[Measured], time_of: Callable[[Hardware, Measured], float]
) -> np.ndarray:
    return np.array([time_of(hw, s) for s in samples])


def _model_time(hw: Hardware, s: Measured) -> float:
    assert isinstance(s, Sample)
    return model_cost(hw, s).time_s


def _same_call(s: Measured) -> object:
    """What the model's time of a sample depends on: samples with the same key (a size a
    log repeats, the same log given twice) are priced once."""
    if isinstance(s, Sample):
        return (s.coll, s.nbytes, s.nranks, s.ranks_per_node, s.algos, s.protos)
    return id(s)


def _distinct(samples: Sequence[Measured]) -> tuple[list[Measured], np.ndarray]:
    """The samples the model must price (one per ``_same_call`` key) and, for each
    sample, the index of its representative among them."""
    first: dict[object, int] = {}
    unique: list[Measured] = []
    where = []
    for s in samples:
        key = _same_call(s)
        if key not in first:
            first[key] = len(unique)
            unique.append(s)
        where.append(first[key])
    return unique, np.array(where, dtype=np.intp)


def fit_samples(
    samples: Sequence[Measured],
    base: Hardware,
    knobs: Sequence[Knob] | None = None,
    *,
    time_of: Callable[[Hardware, Measured], float] = _model_time,
    iterations: int = 40,
) -> Calibration:
    """Fit ``knobs`` (default ``knobs_for(base)``) of ``base`` to the samples' times."""
    if not samples:
        raise InputError("nothing to calibrate on: no measured sizes")
    knobs = tuple(knobs_for(base) if knobs is None else knobs)
    measured = np.log(np.array([s.time_s for s in samples]))
    x0 = np.array([k.to_x(k.start(base)) for k in knobs])
    unique, where = _distinct(samples)
    for s, t in zip(unique, _times(base, unique, time_of), strict=True):
        if not (math.isfinite(t) and t > 0):
            raise InputError(
                f"{s.label}: the model gives this call no time ({t:g} s) on {base.name}, so "
                "no profile can be fitted to it",
                hint="leave this log out, or start from another profile (--base)",
            )

    def build(x: np.ndarray, active: list[int]) -> Hardware:
        hw = base
        for i in active:
            hw = knobs[i].set(hw, knobs[i].from_x(float(x[i])))
        return _variant(hw)

    def residual(x: np.ndarray, active: list[int]) -> np.ndarray:
        return np.log(_times(build(x, active), unique, time_of))[where] - measured

    everything = list(range(len(knobs)))

    def covered(x: np.ndarray) -> list[int]:
        jac = _jacobian(residual, x, residual(x, everything), everything, everything)
        return [i for i in everything if float(np.max(np.abs(jac[:, i]))) > _COVERED]

    # Twice: a term the base leaves at zero (a fill's depth) hides its shape knob (the
    # fill's half size) until the first fit has given it a depth.
    active = covered(x0)
    x = x0.copy()
    for _ in range(2):
        if active:
            x = _levenberg_marquardt(residual, x0, x, active, knobs, iterations)
        more = sorted(set(active) | set(covered(x)))
        if more == active:
            break
        active = more
    fitted_hw = dataclasses.replace(build(x, active), source=base.source)
    before = _residuals(base, samples, time_of)
    after = _residuals(fitted_hw, samples, time_of)
    return Calibration(
        base=base,
        hardware=fitted_hw,
        fitted=tuple((knobs[i], knobs[i].get(base), knobs[i].from_x(float(x[i]))) for i in active),
        kept=tuple(knobs[i] for i in everything if i not in active),
        before=before,
        residuals=after,
    )


def _residuals(
    hw: Hardware, samples: Sequence[Measured], time_of: Callable[[Hardware, Measured], float]
) -> tuple[Residual, ...]:
    unique, where = _distinct(samples)
    priced = [
        (time_of(hw, s), model_cost(hw, s).label if isinstance(s, Sample) else "") for s in unique
    ]
    return tuple(Residual(s, *priced[i]) for s, i in zip(samples, where, strict=True))


def _jacobian(
    residual: Callable[[np.ndarray, list[int]], np.ndarray],
    x: np.ndarray,
    r: np.ndarray,
    active: list[int],
    columns: list[int],
) -> np.ndarray:
    jac = np.zeros((len(r), len(x)))
    for i in columns:
        step = 0.05
        xp = x.copy()
        xp[i] += step
        jac[:, i] = (residual(xp, active) - r) / step
    return jac


def _levenberg_marquardt(
    residual: Callable[[np.ndarray, list[int]], np.ndarray],
    x0: np.ndarray,
    start: np.ndarray,
    active: list[int],
    knobs: Sequence[Knob],
    iterations: int,
) -> np.ndarray:
    """Minimize the soft-L1 cost of the residuals plus the pull toward ``x0`` over the
    ``active`` coordinates, from ``start``, inside the knobs' ranges."""
    low = np.array([k.to_x(k.low) if (k.log is False or k.low > 0) else -np.inf for k in knobs])
    high = np.array([k.to_x(k.high) for k in knobs])
    cols = np.array(active)

    def total(x: np.ndarray) -> tuple[float, np.ndarray]:
        r = residual(x, active)
        prior = _PRIOR * (x[cols] - x0[cols])
        cost = float(np.sum(2 * _SOFT**2 * (np.sqrt(1.0 + (r / _SOFT) ** 2) - 1)) + prior @ prior)
        return cost, r

    x = start.copy()
    cost, r = total(x)
    lam = 1e-2
    for _ in range(iterations):
        jac = _jacobian(residual, x, r, active, active)[:, cols]
        w = 1.0 / np.sqrt(1.0 + (r / _SOFT) ** 2)
        a = (jac * w[:, None]).T @ jac + _PRIOR**2 * np.eye(len(cols))
        g = (jac * w[:, None]).T @ r + _PRIOR**2 * (x[cols] - x0[cols])
        improved = False
        while lam < 1e8:
            step = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-9), -g)
            trial = x.copy()
            trial[cols] = np.clip(x[cols] + step, low[cols], high[cols])
            new_cost, new_r = total(trial)
            if new_cost < cost - 1e-12:
                improved = cost - new_cost > 1e-7 * max(cost, 1e-12)
                x, cost, r = trial, new_cost, new_r
                lam = max(lam / 3, 1e-7)
                break
            lam *= 4
        if not improved:
            break
    return x


# ---------------------------------------------------------------------------------------
# Logs → profile


_GPU_PROFILES = (("h200", "h200-hgx"), ("h100", "h100-dgx"), ("h800", "h100-dgx"),
                 ("h20", "h100-dgx"), ("a100", "a100-dgx"), ("a800", "a100-dgx"),
                 ("v100", "v100-dgx2"))  # fmt: skip
"""GPU names in nccl-tests' Rank lines → the shipped profile to start from."""


def base_for_gpu(gpu: str | None) -> str | None:
    """The shipped profile of a GPU named in a log (``NVIDIA H100 80GB HBM3`` → h100-dgx)."""
    if not gpu:
        return None
    lowered = gpu.lower().replace("-", "").replace(" ", "")
    for key, profile in _GPU_PROFILES:
        if key in lowered and profile in list_profiles():
            return profile
    return None


def calibrate(
    logs: Sequence[NcclTestsLog], base: Hardware, *, in_place: bool = False, iterations: int = 40
) -> Calibration:
    """Fit ``base`` to nccl-tests logs (module docstring)."""
    if not logs:
        raise InputError("give at least one nccl-tests log")
    versions = {log.nccl_version for log in logs if log.nccl_version}
    set_fields: list[tuple[str, object]] = []
    hw = base
    if len(versions) > 1:
        where = ", ".join(f"{log.path}: {log.nccl_version}" for log in logs if log.nccl_version)
        raise InputError(
            f"the logs come from different NCCL releases ({where})",
            hint="calibrate one release at a time: each release has its own tuning constants",
        )
    notes: list[str] = []
    if versions:
        (version,) = versions
        try:
            nccl_tuning(version)
        except ValueError:
            notes.append(
                f"the logs ran NCCL {version}, whose tuning constants the model does not "
                f"tabulate (it knows 2.6.4 and 2.18 onwards); the fit uses {base.name}'s, "
                f"NCCL {base.nccl.version}"
            )
            version = ""
        if version and version != base.nccl.version:
            hw = load_profile_with_version(base, version)
            set_fields.append(("nccl.version", version))
    for log in logs:
        if log.ranks_per_node > hw.gpus_per_node:
            raise InputError(
                f"{log.path}: {log.ranks_per_node} ranks per node, but {hw.name} has "
                f"{hw.gpus_per_node} GPUs per node",
                hint="start from a profile of that machine (--base)",
            )
    samples: list[Sample] = []
    priced: set[object] = set()
    for log in logs:
        mine = log_samples(log, in_place=in_place)
        for s, row in zip(mine, log.rows(in_place), strict=True):
            if _same_call(s) not in priced:
                priced.add(_same_call(s))
                _check_priced(hw, s, log, row.line)
        samples += mine
    if not samples:
        what = "in-place" if in_place else "out-of-place"
        raise InputError(f"the logs have no {what} times", hint="try the other column group")
    result = fit_samples(samples, hw, iterations=iterations)
    return dataclasses.replace(
        result,
        base=base,
        logs=tuple(logs),
        set_fields=tuple(set_fields),
        notes=tuple(notes),
        before=_residuals(base, samples, _model_time),
    )


def _check_priced(hw: Hardware, s: Sample, log: NcclTestsLog, line: int) -> None:
    """A log's point the model cannot price (its NCCL_ALGO / NCCL_PROTO allow nothing the
    model runs for it) is an error at its row, before fitting."""
    try:
        model_cost(hw, s)
    except CostModelError as exc:
        text = log.source.line(line)
        start = len(text) - len(text.lstrip()) + 1
        restricted = " and ".join(
            f"{name}={value}"
            for name, value in (("NCCL_ALGO", log.algo), ("NCCL_PROTO", log.proto))
            if value
        )
        raise InputError(
            str(exc).removeprefix(f"{s.label}: "),
            Span(log.source, line, start, line, len(text) + 1),
            hint=f"the log's {restricted} allows only that for this call; NCCL runs a "
            "collective only where its algorithm serves it, so check the log's header"
            if restricted
            else None,
        ) from None


def load_profile_with_version(base: Hardware, version: str) -> Hardware:
    """``base`` with another NCCL release's tuning constants (the loader's rules)."""
    from cocoviz.sim.hardware import parse_profile

    name = base.name
    if name not in list_profiles():
        raise InputError(f"{base.name}: calibrate starts from a shipped profile")
    parse_nccl_version(version)  # ASCII digits and dots: safe inside the TOML string
    text = f'base = "{name}"\nname = "{name}"\n[nccl]\nversion = "{version}"\n'
    hw = parse_profile(text, f"<{name} at NCCL {version}>")
    return dataclasses.replace(hw, source=base.source + f" (NCCL {version})")


# ---------------------------------------------------------------------------------------
# What `cocoviz calibrate` prints


def residual_table(cal: Calibration, *, in_place: bool = False) -> str:
    """The fit in words and, per log and size, measured and fitted busBw side by side (and
    the base profile's error, to show what the fit changed)."""
    med, worst = cal.summary()
    med0, worst0 = cal.summary(after=False)
    lines = [
        f"# {cal.base.name} fitted to {len(cal.logs)} log{'s' if len(cal.logs) != 1 else ''}, "
        f"{len(cal.residuals)} sizes: busBw error median {med:.1%}, max {worst:.1%} "
        f"(the base profile: {med0:.1%}, {worst0:.1%})",
    ]
    for field, value in cal.set_fields:
        lines.append(f"# set from the logs: {field} = {_toml_value(value)}")
    for note in cal.notes:
        lines.append(f"# note: {printable(note)}")
    for knob, old, new in cal.fitted:
        lines.append(f"# fitted: {knob.field} {_fmt(old)} -> {_fmt(new)}")
    if cal.kept:
        lines.append("# not in the logs (base value kept): " + ", ".join(k.field for k in cal.kept))
    by_log: dict[str, list[tuple[Residual, Residual]]] = {}
    for r, b in zip(cal.residuals, cal.before, strict=True):
        by_log.setdefault(r.sample.label.rsplit(":", 1)[0], []).append((r, b))
    described = {log.path.rsplit("/", 1)[-1]: log for log in cal.logs}
    column = "in-place" if in_place else "out-of-place"
    for name, rows in by_log.items():
        log = described.get(name)
        described_as = printable(f"{name}: {log.describe() if log else ''}")
        lines += ["#", f"# {described_as} ({column})"]
        lines.append(
            f"#{'size':>11}  {'measured':>9}  {'fitted':>9}  {'error':>7}  {'base':>7}  algo/proto"
        )
        lines.append(f"#{'(B)':>11}  {'busbw':>9}  {'busbw':>9}")
        for r, b in rows:
            s = r.sample
            assert isinstance(s, Sample)
            lines.append(
                f"{s.nbytes:>12}  {s.busbw:>9.2f}  {r.model_busbw:>9.2f}  "
                f"{r.error:>+7.1%}  {b.error:>+7.1%}  {r.label}"
            )
    return "\n".join(lines) + "\n"
