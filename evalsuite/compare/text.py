"""A server that returns text without token ids: where its text is not valid UTF-8 (a byte-level token cut
mid-character) its ids cannot be rebuilt, and it is compared as text."""

from __future__ import annotations

import numpy as np


def resolve(tok, tokens: list[int], eg, prefix: bool = False) -> str | None:
    """None when the engine's ids are its own; else "text" when its text equals the judge's for tokens (its ids
    are then set to tokens), or "unresolved" when it differs. prefix: the generation was cut by a stop check the
    server never saw (the batching part's staggered stops), so its text may run on past the judge's."""
    if eg.ids_exact:
        return None
    want = tok.decode(list(tokens)) if tok is not None else None
    if want is not None and (eg.text == want or (prefix and eg.text.startswith(want))):
        n = len(tokens)
        eg.token_ids, eg.ids_exact = list(tokens), True
        if len(eg.top_logprobs) != n:  # the server's per-token logprobs do not line up: drop them
            eg.top_logprobs = np.full((n, 1), np.nan, np.float32)
        return "text"
    return "unresolved"
