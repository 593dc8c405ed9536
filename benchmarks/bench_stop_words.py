#!/usr/bin/env python
"""What a stop-word list costs per decoding step: ftx's trie against checking every word (#33.4).

For word counts from 1 to the per-prompt limit (1024), times the check a generating row makes at each
step ("does the text end with a stop word?", and for bad words "which tokens would complete one?") over
a 4096-token history, with words of 1 to 8 tokens drawn from a 50k vocabulary. Prints the median
microseconds per check of each and the ratio; the trie's column should stay flat as the words grow.

    python benchmarks/bench_stop_words.py
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from functools import partial

from ftx_triton.runtime.python.words import MAX_WORDS, WordTrie

VOCAB = 50_000
HISTORY = 4096
REPEATS = 7


def plain_ends_with(sequence: list[int], words: list[tuple[int, ...]]) -> bool:
    """The check before the trie: every word compared with the end of the text."""
    n = len(sequence)
    return any(len(w) <= n and tuple(sequence[n - len(w) :]) == w for w in words)


def median_us(check: Callable[[], object], calls: int = 200) -> float:
    times = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        for _ in range(calls):
            check()
        times.append((time.perf_counter() - began) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    rng = random.Random(0)
    history = [rng.randrange(VOCAB) for _ in range(HISTORY)]
    print(f"{'words':>6} {'every word (us)':>16} {'trie (us)':>10} {'ratio':>7} {'trie completions (us)':>22}")
    for count in (1, 16, 128, MAX_WORDS):
        words = [tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, 8))) for _ in range(count)]
        trie = WordTrie(words)
        plain = median_us(partial(plain_ends_with, history, words))
        fast = median_us(partial(trie.ends_with, history))
        completions = median_us(partial(trie.completions, history))
        print(f"{count:>6} {plain:>16.2f} {fast:>10.2f} {plain / fast:>7.1f} {completions:>22.2f}")


if __name__ == "__main__":
    main()
