"""The simulator's deterministic text: answers, word counts, embeddings.

Token ``i`` of an answer depends only on ``(seed, i)``. That is what makes a
mid-stream resume testable: a request that continues the first k tokens gets
exactly the rest of the uninterrupted answer, so ``prefix + continuation``
equals the full text.
"""

from __future__ import annotations

import functools
import hashlib
import struct

_WORDS_TEXT = """
able acid aged also area army away baby back ball band bank base bath bear beat
been beer bell belt best bill bird blow blue boat body bolt bond bone book boom
born boss both bowl bulk burn bush busy cake call calm came camp card care case
cash cast cell chat chip city club coal coat code cold come cook cool cope copy
core cost crew crop dark data date dawn days deck deal deer dear debt deep deny
desk dial diet disc disk does done door dose down draw drew drop drum dual dune
dust duty each earn ease east easy edge else even ever echo exit face fact fail
fair fall farm fast fate fear feed feel feet fell felt file fill film find fine
fire firm fish five flat flow food foot fork form fort four free from fuel full
fund gain game gate gave gear gene gift girl give glad goal goes gold golf gone
good gray grew grey grow gulf hair half hall hand hang hard harm harp have head
hear heat held heap help here hero high hill hire hold hole holy home hope host
hour huge hung hunt hush idea inch into iron item jack jade jest jolt join jump
jury just keen keep kelp kept kick kite kind king knee knew know lack lady laid
lake land lane last late lead left less life lift like line link list live load
loan lock logo long look lord lose loss lost love luck made mail main make male
many mark mass mast meal mean meat meet menu mere mint mile milk mill mind mine
miss mode mood moon more most move much must name navy near neck need news next
nice nest nine none nose note okay once only onto open oral over pace pack page
"""

WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())
"""The fixed vocabulary; a token is one of these, with a leading space after the first."""

_MASK64 = (1 << 64) - 1


def _mix(seed: int, index: int) -> int:
    """SplitMix64 finaliser of (seed, index): cheap, and well spread over the vocabulary."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


@functools.lru_cache(maxsize=256)
def answer_token_tuple(seed: int, n_tokens: int) -> tuple[str, ...]:
    """The answer's tokens, cached: every request with the same seed and size reuses them."""
    words = WORDS
    return tuple((" " if i else "") + words[_mix(seed, i) % len(words)] for i in range(n_tokens))


def answer_tokens(seed: int, n_tokens: int) -> list[str]:
    """Tokens 0..n_tokens-1 of the answer for ``seed`` (token 0 has no leading space)."""
    return list(answer_token_tuple(seed, n_tokens))


def answer_text(seed: int, n_tokens: int) -> str:
    """The uninterrupted answer of ``n_tokens`` tokens, as a client would assemble it."""
    return "".join(answer_token_tuple(seed, n_tokens))


def count_words(text: str) -> int:
    """Whitespace-separated words: the simulator's stand-in for a tokenizer."""
    return len(text.split())


def embedding_vector(text: str) -> list[float]:
    """Eight floats in [-1, 1) derived from the text alone, so equal inputs embed equally."""
    digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
    return [value / 32768.0 for value in struct.unpack("<8h", digest)]
