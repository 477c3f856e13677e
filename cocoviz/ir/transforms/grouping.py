"""Queries and edits shared by `fuse`, `overlap` and `decompose`: convex hulls, cycles through
existing groups, moving a new group's stages next to each other, and checking that an
existing group is still one the steps would make.

Invariant relied on: the stage order is a topological order of the graph with every
group contracted, and each group is a contiguous run of it (verified after every step).
Every edge then points forward, so a path that leaves a set of stages and comes back
stays between the set's first and last position: all searches here are bounded by it.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping

from cocoviz.ir.nodes import Group, Program
from cocoviz.ir.transforms.base import (
    Edit,
    Index,
    describe_stage,
    edit_program,
    splice,
)
from cocoviz.ir.transforms.step import Transformation


def hull(idx: Index, names: Iterable[str]) -> set[str]:
    """The convex hull of `names` over data and ordering edges (groups not contracted)."""
    members = set(names)
    pos = [idx.position(n) for n in members]
    lo, hi = min(pos), max(pos)
    down: set[str] = set()
    below = set(members)  # the members and `down`
    for i in range(lo, hi + 1):
        n = idx.stages[i].name
        if n not in members and not idx.preds(n).isdisjoint(below):
            down.add(n)
            below.add(n)
    up: set[str] = set()
    above = set(members)  # the members and `up`
    for i in range(hi, lo - 1, -1):
        n = idx.stages[i].name
        if n not in members and not idx.succs(n).isdisjoint(above):
            up.add(n)
            above.add(n)
    return members | (down & up)


def _group_members(idx: Index, name: str) -> list[str]:
    g = idx.group_of(name)
    return list(g.stages()) if g is not None else [name]


def cycle_through_groups(idx: Index, members: set[str]) -> tuple[list[str], Group] | None:
    """A path that leaves `members` and comes back through an existing group (which
    would make the contracted graph cyclic), as (path, that group); None if none."""
    hi = max(idx.position(n) for n in members)
    parent: dict[str, str] = {}
    queue: deque[str] = deque()
    for m in sorted(members, key=idx.position):
        for s in sorted(idx.succs(m), key=idx.position):
            if s not in members and s not in parent and idx.position(s) <= hi:
                parent[s] = m
                queue.append(s)
    expanded: set[int] = set()  # groups, by id
    while queue:
        n = queue.popleft()
        g = idx.group_of(n)
        if g is not None and id(g) in expanded:
            continue
        if g is not None:
            expanded.add(id(g))
        expand = _group_members(idx, n)
        for k in expand:
            parent.setdefault(k, n)
        for k in expand:
            for s in sorted(idx.succs(k), key=idx.position):
                if s in members:
                    path = _path(parent, k, members) + [s]
                    group = next(idx.group_of(p) for p in path if idx.group_of(p) is not None)
                    assert group is not None
                    return path, group
                if s not in parent and idx.position(s) <= hi:
                    parent[s] = k
                    queue.append(s)
    return None


def render_cycle(path: list[str], group: Group) -> str:
    """`p → {q, r} → s`: the path, with the stages of `group` collapsed into it."""
    inner = set(group.stages())
    parts: list[str] = []
    for n in path:
        if n in inner:
            label = "{" + ", ".join(group.stages()) + "}"
            if not parts or parts[-1] != label:
                parts.append(label)
        else:
            parts.append(n)
    return " → ".join(parts)


def _path(parent: dict[str, str], end: str, members: set[str]) -> list[str]:
    path = [end]
    n = end
    while n not in members:
        n = parent[n]
        path.append(n)
    return list(reversed(path))


def first_stage(g: Group) -> str:
    """`next(g.stages())` without a generator per nested group (a bisection over the
    groups asks for many)."""
    it = g.items[0]
    while isinstance(it, Group):
        it = it.items[0]
    return it


def regroup(
    program: Program,
    idx: Index,
    new_group: Group,
    absorbed: Mapping[int, Group],
) -> Edit:
    """`program` with `new_group` added (replacing the `absorbed` groups, keyed by id)
    and its stages moved together: between its first and last member, the stages it
    depends on go before it and the others after it, each in their old order. The
    edit's `moved` are the stages whose position may have changed (none when the stages
    already run in that order: the stage tuple is then kept)."""
    members = list(new_group.stages())
    mset = set(members)
    position = idx.position
    pos = [position(n) for n in members]
    lo, hi = min(pos), max(pos)
    span = [s.name for s in idx.stages[lo : hi + 1]]
    before: set[str] = set()
    changed = True
    while changed:
        changed = False
        for n in reversed(span):
            if n in mset or n in before:
                continue
            if idx.succs(n) & (mset | before):
                for k in _group_members(idx, n):
                    before.add(k)
                changed = True
    rank = {n: i for i, n in enumerate(members)}
    ordered = (
        [n for n in span if n in before]
        + sorted(members, key=rank.__getitem__)
        + [n for n in span if n not in before and n not in mset]
    )
    moved = {n: lo + i for i, n in enumerate(ordered)}

    def first(g: Group) -> int:
        n = first_stage(g)
        return moved[n] if n in moved else position(n)

    old = program.groups
    if idx.groups_sorted:
        # Groups are kept in the order of their first stages. Only those that start in
        # the span move (the absorbed ones among them); the others keep their places.
        def first_before(g: Group) -> int:
            return position(first_stage(g))

        a = bisect.bisect_left(old, lo, key=first_before)
        b = bisect.bisect_right(old, hi, key=first_before)
        inner = [g for g in old[a:b] if id(g) not in absorbed] + [new_group]
        inner.sort(key=first)
        groups = old[:a] + tuple(inner) + old[b:]
    else:
        unsorted = [g for g in old if id(g) not in absorbed] + [new_group]
        unsorted.sort(key=first)
        groups = tuple(unsorted)
    if ordered == span:
        # the stages already run together (the usual case): only the groups change, and
        # the new program keeps the stage tuple, which spares the index and the checks
        # a pass over stages that did not move
        same = edit_program(program, groups=groups)
        return Edit(same, window=(lo, lo, lo), groups_sorted=True)
    new, window = splice(program, lo, hi + 1, [idx.stage(n) for n in ordered], groups=groups)
    return Edit(new, moved=set(span), window=window, groups_sorted=True)


def add_overlapped(
    step: Transformation,
    program: Program,
    idx: Index,
    members: set[str],
    group: Group,
    between: str,
    hint: str,
) -> Edit:
    """`program` with the overlapped `group` of `members` (absorbing their fused groups),
    or `step`'s refusal when a stage outside lies between members (`between` says what
    that means for the step, `hint` what to do) or the group would close a cycle through
    an existing group."""
    h = hull(idx, members)
    if h != members:
        first = idx.stage(min(h - members, key=idx.position))
        raise step.error(f"{describe_stage(first)} {between}", stage=first, hint=hint)
    cyc = cycle_through_groups(idx, members)
    if cyc is not None:
        path, other = cyc
        raise step.error(
            f"the group would close a cycle through the {other.kind.value} group "
            f"{{{', '.join(other.stages())}}}: {render_cycle(path, other)}",
            stage=idx.stage(path[1]),
        )
    absorbed = {id(g): g for n in members if (g := idx.group_of(n)) is not None}
    return regroup(program, idx, group, absorbed)
