"""Stop and bad word lists (#33.4): limits at the edge, and matching whose cost does not grow with the
number of words (a reversed trie), checked against the plain definition on random words."""

from __future__ import annotations

import random

import numpy as np
import pytest
from ftx_triton.repository.textproc import encode_words
from ftx_triton.runtime.python.generation import ModelLimits, RequestError, decode_words, parse_request
from ftx_triton.runtime.python.words import MAX_WORD_TOKENS, MAX_WORDS, WordTrie
from python_runtime_support import decoder_inputs

LIMITS = ModelLimits(vocab_size=256, end_id=0, start_id=0, max_positions=64)


def _plain_ends_with(sequence: list[int], words: list[tuple[int, ...]]) -> bool:
    return any(len(w) <= len(sequence) and tuple(sequence[len(sequence) - len(w) :]) == w for w in words)


def _plain_completions(sequence: list[int], words: list[tuple[int, ...]]) -> set[int]:
    return {w[-1] for w in words if _plain_ends_with(sequence, [w[:-1]]) or len(w) == 1}


def test_trie_answers_like_checking_every_word() -> None:
    rng = random.Random(7)
    for _ in range(200):
        words = [tuple(rng.randrange(4) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 6))]
        sequence = [rng.randrange(4) for _ in range(rng.randint(0, 8))]
        trie = WordTrie(words)
        assert trie.ends_with(sequence) == _plain_ends_with(sequence, words), (words, sequence)
        assert trie.completions(sequence) == _plain_completions(sequence, words), (words, sequence)


def test_trie_walks_at_most_the_longest_word_whatever_the_number_of_words() -> None:
    """The matcher looks at no more than the longest word's tokens of the sequence: a tail that
    differs only before them gives the same answer (so the cost cannot depend on the word count)."""
    words = [(i, i + 1) for i in range(MAX_WORDS)]
    trie = WordTrie(words)
    assert trie.longest == 2
    assert trie.ends_with([9] * 10_000 + [5, 6])
    assert trie.completions([7] * 10_000 + [5]) == {6}


def test_a_list_of_too_many_words_is_refused_before_it_is_walked() -> None:
    """#33.4: 500,000 stop words held the model for 99 s; now more than MAX_WORDS per item is a 400."""
    many = encode_words([[(1,)] * (MAX_WORDS + 1)])
    with pytest.raises(RequestError, match=f"at most {MAX_WORDS}"):
        decode_words(many, 1, "stop_words_list")
    wide = np.zeros((1, 2, MAX_WORDS * MAX_WORD_TOKENS + 1), np.int32)
    with pytest.raises(RequestError, match="ids wide"):
        parse_request({**decoder_inputs([[1, 2]], 2), "stop_words_list": wide}, LIMITS)
    long_word = encode_words([[tuple(range(1, MAX_WORD_TOKENS + 2))]])
    with pytest.raises(RequestError, match=f"longer than {MAX_WORD_TOKENS} tokens"):
        parse_request({**decoder_inputs([[1, 2]], 2), "bad_words_list": long_word}, LIMITS)
    assert len(decode_words(encode_words([[(1,)] * MAX_WORDS]), 1, "w")[0]) == MAX_WORDS
