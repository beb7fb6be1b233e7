"""Draft trees (EAGLE-2 style): several continuations verified in one target decode.

A tree is built depth by depth from the drafter: the root's top ``width`` tokens are the first
candidates; at each further depth the ``width`` candidates with the highest path probability (the
product of the drafter's probabilities along the path) are expanded, all in one drafter decode
(each in its own llama.cpp sequence, attending to the committed prefix and its own ancestors), and
each offers its top ``width`` children. At the end the ``max_nodes`` candidates with the highest
path probability form the tree (it stays closed under parents: a child's path probability never
exceeds its parent's).

The target verifies the root (the last committed token) and every node in one batch: node rows
belong to the llama.cpp sequences of the leaves below them, so each row attends only to the prefix
and its ancestors. Walking down from the root, the target's choice at each node (argmax, or a
sample from its distribution) is accepted if it is one of the node's children: since drafts are
deterministic this emits exactly the target's own choices, greedy or sampled, whatever the tree.

``prune`` cuts a tree to the size that maximises expected tokens per second under the cost model,
with each node's acceptance estimated from its draft probability through :class:`Calibration`
(learned live: the fraction of nodes of each probability band the target accepted).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from ..core import options

WIDTH = 4          # candidates expanded per depth, and children offered by each
# draft nodes verified at most (plus the root); also the most leaves, each a llama.cpp sequence
# of the target context (built with 1 + MAX_NODES)
MAX_NODES = options.TREE_MAX_NODES
MAX_WIDTH = options.TREE_MAX_WIDTH   # the drafter context has 1 + MAX_WIDTH sequences
BANDS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # draft probability band edges
DECAY = 0.995


@dataclass
class DraftTree:
    """Nodes in breadth-first order: ``parents[i]`` is -1 for children of the root."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)    # the drafter's probability given the parent
    scores: list[float] = field(default_factory=list)   # product of probs along the path

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    def add(self, token: int, parent: int, prob: float) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        self.probs.append(float(prob))
        self.scores.append(float(prob) * (1.0 if parent < 0 else self.scores[parent]))
        return len(self.tokens) - 1

    def subset(self, keep: list[int]) -> "DraftTree":
        """The tree of the nodes ``keep`` (closed under parents), breadth-first."""
        order = sorted(keep, key=lambda i: (self.depths[i], i))
        new_index = {old: new for new, old in enumerate(order)}
        out = DraftTree()
        for old in order:
            p = self.parents[old]
            out.tokens.append(self.tokens[old])
            out.parents.append(-1 if p < 0 else new_index[p])
            out.depths.append(self.depths[old])
            out.probs.append(self.probs[old])
            out.scores.append(self.scores[old])
        return out

    def top(self, n: int, weights: list[float] | None = None) -> "DraftTree":
        """The ``n`` nodes of highest score (or ``weights``), closed under parents."""
        w = self.scores if weights is None else weights
        ranked = sorted(range(len(self)), key=lambda i: (-w[i], self.depths[i], i))
        keep: set[int] = set()
        for i in ranked:
            if len(keep) >= n:
                break
            chain = []
            j = i
            while j >= 0 and j not in keep:
                chain.append(j)
                j = self.parents[j]
            if len(keep) + len(chain) <= n:
                keep.update(chain)
        return self.subset(sorted(keep))

    def children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(len(self) + 1)]  # index 0: the root
        for i, p in enumerate(self.parents):
            out[p + 1].append(i)
        return out

    def leaf_sets(self) -> list[list[int]]:
        """For the root (index 0) and each node (index i + 1): the leaf numbers below it, the
        first being the leaf its row attends through."""
        kids = self.children()
        sets: list[list[int]] = [[] for _ in range(len(self) + 1)]
        n_leaf = 0
        for i in range(len(self) - 1, -1, -1):   # children come after their parents
            if not kids[i + 1]:
                sets[i + 1] = [n_leaf]
                n_leaf += 1
            else:
                sets[i + 1] = [s for c in kids[i + 1] for s in sets[c + 1]]
        sets[0] = [s for c in kids[0] for s in sets[c + 1]]
        return sets

    def preorder(self) -> list[int]:
        """Nodes depth-first, the more probable child first: the most probable chain leads, so
        an accepted path that follows it occupies the batch rows right after the root."""
        kids = self.children()
        out: list[int] = []
        stack = sorted(kids[0], key=lambda c: self.scores[c])
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(sorted(kids[node + 1], key=lambda c: self.scores[c]))
        return out

    def path_to(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def top_tokens(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` most probable tokens of a logit row and their softmax probabilities."""
    # k argmax passes: a drafter's full-vocabulary row is mostly -inf (outside its draft
    # vocabulary), on which argpartition degrades to ~10 ms a row
    k = min(k, logits.shape[0])
    work = np.array(logits, dtype=np.float32)
    ids = np.empty(k, dtype=np.int64)
    for j in range(k):
        ids[j] = int(np.argmax(work))
        work[ids[j]] = -np.inf
    top = float(logits[ids[0]])
    total = float(np.exp(logits - top, dtype=np.float32).sum())
    probs = np.exp(logits[ids] - top) / total
    return ids, probs


def build(drafter, logits: np.ndarray, state: np.ndarray, n_past: int, *, depth: int,
          width: int = WIDTH, max_nodes: int = 24) -> DraftTree:
    """An EAGLE-2 dynamic tree from the drafter's first-draft ``logits``/``state`` (the drafter
    holds the committed pairs below ``n_past``). Costs ``depth - 1`` drafter decodes of up to
    ``width`` rows; leaves the drafter's committed pairs as they were."""
    tree = DraftTree()
    ids, probs = top_tokens(logits, width)
    frontier = [tree.add(t, -1, p) for t, p in zip(ids, probs)]
    states = {-1: state}
    seq_of: dict[int, int] = {}   # expanded node -> the drafter sequence of its row
    free = list(range(drafter.tree_seqs, 0, -1))
    try:
        for d in range(1, depth):
            # a frontier row attends to the prefix and its ancestors: the first child of a node
            # takes over the node's sequence, its siblings get copies (llama.cpp shares the cells)
            needed = {tree.parents[n] for n in frontier}
            for node in [n for n in seq_of if n not in needed]:
                seq = seq_of.pop(node)
                drafter.forget(seq)
                free.append(seq)
            taken: set[int] = set()
            rows: dict[int, int] = {}
            for node in frontier:
                parent = tree.parents[node]
                if parent >= 0 and parent not in taken:
                    taken.add(parent)
                    rows[node] = seq_of[parent]
                else:
                    rows[node] = free.pop()
                    drafter.fork(0 if parent < 0 else seq_of[parent], rows[node])
            seq_of = rows
            outs = drafter.decode_branches([tree.tokens[n] for n in frontier],
                                           np.stack([states[tree.parents[n]] for n in frontier]),
                                           n_past + d - 1, [rows[n] for n in frontier])
            candidates = []
            for node, (row_logits, row_state) in zip(frontier, outs):
                states[node] = row_state
                ids, probs = top_tokens(row_logits, width)
                candidates.extend(tree.add(t, node, p) for t, p in zip(ids, probs))
            candidates.sort(key=lambda i: -tree.scores[i])
            frontier = candidates[:width]
    finally:
        for seq in seq_of.values():
            drafter.forget(seq)
    return tree.top(max_nodes)


class Calibration:
    """P(target accepts a node | it accepted the parent), by band of the node's draft probability;
    starts at the draft probability itself and learns from every verified tree."""

    def __init__(self) -> None:
        mids = [(lo + hi) / 2 for lo, hi in zip((0.0,) + BANDS, BANDS + (1.0,))]
        self.prior = mids
        self.hit = [m * 2.0 for m in mids]
        self.seen = [2.0] * len(mids)

    @staticmethod
    def band(p: float) -> int:
        return bisect.bisect_right(BANDS, p)

    def rate(self, p: float) -> float:
        b = self.band(p)
        return self.hit[b] / self.seen[b]

    def observe(self, p: float, accepted: bool) -> None:
        b = self.band(p)
        self.seen[b] = self.seen[b] * DECAY + 1.0
        self.hit[b] = self.hit[b] * DECAY + (1.0 if accepted else 0.0)

    def expected(self, tree: DraftTree) -> list[float]:
        """Estimated probability that each node is accepted (its whole path is)."""
        out: list[float] = []
        for i, p in enumerate(tree.probs):
            parent = tree.parents[i]
            out.append(self.rate(p) * (1.0 if parent < 0 else out[parent]))
        return out

    def learn(self, tree: DraftTree, path: list[int]) -> None:
        """Score every node whose parent was accepted (the root always is)."""
        on_path = set(path)
        for i, parent in enumerate(tree.parents):
            if parent < 0 or parent in on_path:
                self.observe(tree.probs[i], i in on_path)


def prune(tree: DraftTree, calibration: Calibration, seconds_for, fixed_seconds: float) -> DraftTree:
    """The sub-tree (highest estimated acceptance first) with the best expected tokens per second:
    ``(1 + sum of node acceptances) / (seconds_for(nodes + 1) + fixed_seconds)``; at least one node."""
    est = calibration.expected(tree)
    order = sorted(range(len(tree)), key=lambda i: (-est[i], tree.depths[i], i))  # closed prefixes
    best_n, best_rate, total = 1, -1.0, 0.0
    for n, i in enumerate(order, start=1):
        total += est[i]
        rate = (1.0 + total) / (seconds_for(n + 1) + fixed_seconds)
        if rate > best_rate:
            best_rate, best_n = rate, n
    return tree.top(best_n, est)


def walk(tree: DraftTree, choose) -> tuple[list[int], int]:
    """Follow the target's choices down the tree: ``choose(node)`` is the target's token after
    ``node`` (-1: the root). Returns the accepted nodes and the target's token after the last."""
    kids = tree.children()
    path: list[int] = []
    node = -1
    while True:
        tok = choose(node)
        nxt = next((c for c in kids[node + 1] if tree.tokens[c] == tok), None)
        if nxt is None:
            return path, tok
        path.append(nxt)
        node = nxt
