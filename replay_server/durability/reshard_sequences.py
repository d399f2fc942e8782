"""Resharding sequence tables: every trajectory's steps go to one new shard together, relinked.

An item refers to its trajectory's steps through the links from each step to the next (sequences.py), so the
steps of one trajectory on one source (its *chain*: the steps linked to each other) must land on one target, in
order. Chains are dealt to the targets largest first, each to the target holding fewest rows so far (even shares as
far as whole chains allow); rows keep the transitions' dealing order (rounds over the sources, so a target's rows
interleave the sources by age), which gives each row its new key, and each link becomes the distance between the
new keys of a step and its successor. Items, their fields and priorities travel with their first step's row.
Not carried over, as for transitions: writers' state (the tails included: a writer's next window after the
restart reaches back to steps the new shard cannot name, and is refused until the writer sends its steps again).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

import numpy as np

from apexrl.common.settings import SettingsError
from apexrl.replay_server.core.table_state import NEXT_STEP, TableState
from apexrl.replay_server.durability.checkpoint import CheckpointReader


def dealing_order(sizes: list[int], rounds: int) -> Iterator[tuple[int, int, int]]:
    """(source, first row, rows) in the order rows are dealt: round t takes the next 1/rounds of every source."""
    taken = [0] * len(sizes)
    for t in range(1, rounds + 1):
        for s, size in enumerate(sizes):
            count = size * t // rounds - taken[s]
            if count > 0:
                yield s, taken[s], count
                taken[s] += count


def sequence_state(states: list[TableState]) -> dict:
    """The sequence fields the targets' states take from the sources (SettingsError when they disagree)."""
    lengths = {s.max_sequence_length for s in states}
    if 0 in lengths and len(lengths) > 1:
        raise SettingsError("the sources mix sequence tables and tables of transitions")
    fields = {s.item_signature for s in states if s.item_signature is not None}
    if len(fields) > 1:
        raise SettingsError(f"the sources' items have different fields: {', '.join(map(str, fields))}")
    return {"max_sequence_length": max(lengths), "item_signature": next(iter(fields), None), "tails": ()}


class SequenceRouter:
    """Where each source row goes and its new link (see the module docstring), planned from the sources' links
    before any row is written."""

    def __init__(self, readers: list[CheckpointReader], targets: int, rounds: int, capacity: int) -> None:
        links = [_links(reader) for reader in readers]
        chains = [_chains(link) for link in links]
        self.target = _deal(chains, targets)
        new_keys, counts = _new_keys(self.target, rounds, targets)
        if max(counts) > capacity:
            raise SettingsError(
                f"the trajectories dealt whole need {max(counts)} rows on one target, more than its capacity "
                f"{capacity}; give a larger --capacity"
            )
        self.rows = counts
        self.links = []
        for link, keys in zip(links, new_keys, strict=True):
            rows = np.arange(len(link))
            has_next = link > 0
            relinked = np.zeros(len(link), dtype=np.int32)
            relinked[has_next] = keys[rows[has_next] + link[has_next]] - keys[has_next]
            self.links.append(relinked)

    def pick(self, source: int, first: int, count: int, target: int) -> np.ndarray:
        """Which of the source's rows first .. first + count - 1 go to `target` (indices into them)."""
        return np.flatnonzero(self.target[source][first : first + count] == target)

    def relinked(self, source: int, first: int, columns: dict) -> dict:
        """`columns` of the source's rows from `first` on, with their links as on their target."""
        count = len(columns[NEXT_STEP])
        return {**columns, NEXT_STEP: self.links[source][first : first + count]}


def _links(reader: CheckpointReader) -> np.ndarray:
    """Each held row's link (key distance to its trajectory's next step; 0: none), rows in key order; a link
    past the held rows is cut."""
    parts = [np.asarray(columns[NEXT_STEP], dtype=np.int64) for _, columns, _ in reader.blocks()]
    link = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    rows = np.arange(len(link))
    link[rows + link >= len(link)] = 0
    return link


def _chains(link: np.ndarray) -> np.ndarray:
    """Each row's chain number: rows linked to each other share one."""
    chain = np.full(len(link), -1, dtype=np.int64)
    count = 0
    for row, distance in enumerate(link.tolist()):
        if chain[row] < 0:
            chain[row] = count
            count += 1
        if distance > 0:
            chain[row + distance] = chain[row]
    return chain


def _deal(chains: list[np.ndarray], targets: int) -> list[np.ndarray]:
    """Each source row's target: whole chains, largest first, to the target with fewest rows so far."""
    sized = []
    for s, chain in enumerate(chains):
        if len(chain):
            ids, sizes = np.unique(chain, return_counts=True)
            sized += [(-int(size), s, int(c)) for c, size in zip(ids, sizes, strict=True)]
    sized.sort()
    loads = [(0, t) for t in range(targets)]
    assigned: list[dict[int, int]] = [{} for _ in chains]
    for negative, s, c in sized:
        load, t = heapq.heappop(loads)
        assigned[s][c] = t
        heapq.heappush(loads, (load - negative, t))
    out = []
    for s, chain in enumerate(chains):
        lookup = np.zeros(len(assigned[s]) and max(assigned[s]) + 1, dtype=np.int64)
        for c, t in assigned[s].items():
            lookup[c] = t
        out.append(lookup[chain] if len(chain) else np.zeros(0, dtype=np.int64))
    return out


def _new_keys(target: list[np.ndarray], rounds: int, targets: int) -> tuple[list[np.ndarray], list[int]]:
    """Each source row's key on its target (rows dealt in dealing_order) and each target's rows."""
    keys = [np.zeros(len(t), dtype=np.int64) for t in target]
    counts = np.zeros(targets, dtype=np.int64)
    for s, first, count in dealing_order([len(t) for t in target], rounds):
        where = target[s][first : first + count]
        for t in np.unique(where).tolist():
            rows = np.flatnonzero(where == t)
            keys[s][first + rows] = counts[t] + np.arange(len(rows))
            counts[t] += len(rows)
    return keys, counts.tolist()
