"""Stop and bad word lists of token ids: their limits and a matcher whose cost does not grow with their number.

A request may carry many words; checking each one at every decoding step made the cost words x
tokens (500,000 stop words held the model for 99 s). :class:`WordTrie` holds the words reversed in a
trie, so "does this sequence end with a word?" walks back at most the longest word's length, and
"which tokens would complete a word here?" (bad words) walks the same way over the words' prefixes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

MAX_WORDS = 1024
"""Words one batch item may carry in ``stop_words_list`` or ``bad_words_list``."""
MAX_WORD_TOKENS = 64
"""Tokens one word may have."""

Word = tuple[int, ...]
_END = -1  # marks "a word ends here" inside a trie node (token ids are never negative)


class WordTrie:
    """Words stored back to front: ``ends_with`` and ``completions`` cost O(longest word), whatever their number."""

    def __init__(self, words: Iterable[Word]) -> None:
        self.root: dict[int, dict] = {}
        self.prefixes: dict[int, dict] = {}  # reversed prefixes (all but the last token) → last tokens
        self.single: set[int] = set()  # one-token words: banned everywhere
        self.longest = 0
        for word in words:
            if not word:
                continue
            self.longest = max(self.longest, len(word))
            node = self.root
            for token in reversed(word):
                node = node.setdefault(token, {})
            node[_END] = {}
            if len(word) == 1:
                self.single.add(word[0])
                continue
            node = self.prefixes
            for token in reversed(word[:-1]):
                node = node.setdefault(token, {})
            node.setdefault(_END, {})[word[-1]] = {}

    def __bool__(self) -> bool:
        return self.longest > 0

    def ends_with(self, sequence: Sequence[int]) -> bool:
        """Whether ``sequence`` ends with one of the words."""
        node = self.root
        for token in reversed(sequence[-self.longest :] if self.longest else ()):
            node = node.get(int(token))  # type: ignore[assignment]
            if node is None:
                return False
            if _END in node:
                return True
        return False

    def completions(self, sequence: Sequence[int]) -> set[int]:
        """Tokens that would complete a word after ``sequence`` (one-token words always do)."""
        banned = set(self.single)
        node = self.prefixes
        for token in reversed(sequence[-(self.longest - 1) :] if self.longest > 1 else ()):
            node = node.get(int(token))  # type: ignore[assignment]
            if node is None:
                break
            banned.update(node.get(_END, ()))
        return banned


@lru_cache(maxsize=256)
def trie(words: tuple[Word, ...]) -> WordTrie:
    """The trie of a word list (word lists are tuples and repeat across steps and items: built once)."""
    return WordTrie(words)
