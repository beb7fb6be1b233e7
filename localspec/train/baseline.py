"""A drafter-free baseline: a bigram table from the training data, drafting greedy chains.

``tokens_per_cycle`` is simulated exactly as a fixed-depth speculative loop would run on the
target's greedy responses: each cycle drafts ``depth`` tokens from the bigram table starting at
the last committed token, accepts the longest matching prefix, and commits one more token.
"""

from __future__ import annotations

from collections import Counter, defaultdict


def bigram_table(token_lists) -> dict[int, int]:
    counts: dict[int, Counter] = defaultdict(Counter)
    for toks in token_lists:
        for a, b in zip(toks, toks[1:]):
            counts[a][b] += 1
    return {a: c.most_common(1)[0][0] for a, c in counts.items()}


def simulate_tokens_per_cycle(table: dict[int, int], prompt: list[int], response: list[int], depth: int = 4) -> float:
    """Tokens per cycle of a depth-``depth`` bigram chain over one greedy response."""
    seq = list(prompt) + list(response)
    pos = len(prompt)          # next position to produce
    end = len(seq)
    cycles = 0
    # the first response token comes from the prompt's prefill, as in the engine (not a cycle)
    pos += 1
    while pos < end:
        last = seq[pos - 1]
        accepted = 0
        for _ in range(depth):
            nxt = table.get(last)
            if nxt is None or pos + accepted >= end or seq[pos + accepted] != nxt:
                break
            accepted += 1
            last = nxt
        pos += accepted + 1
        cycles += 1
    return (len(response) - 1) / cycles if cycles else 0.0
