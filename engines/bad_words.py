"""vLLM's `bad_words` as token sequences: each word as it would begin the text and, where the
tokenizer spells a word after a space differently (a leading-space token), as it would follow
one. A word is banned by refusing the token that would complete one of its spellings
(engines/logit_adjust.py), so a word split across other tokens is not caught, as in vLLM."""

from __future__ import annotations

from engines.tokenizer import TextTokenizer


def bad_words_token_ids(tokenizer: TextTokenizer, words: list[str]) -> tuple[tuple[int, ...], ...]:
    out: list[tuple[int, ...]] = []
    for word in words:
        bare = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        if not bare:
            continue
        out.append(bare)
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        # The spaced spelling counts only as a different first token of the same word: a
        # tokenizer that makes the space a token of its own would otherwise ban every space.
        if len(spaced) == len(bare) and spaced[0] != bare[0]:
            out.append(spaced)
    return tuple(out)
