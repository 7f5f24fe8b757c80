"""A server that returns text without token ids, whose text could not be turned back into its own ids (not valid
UTF-8: a byte-level token cut mid-character; or re-tokenized to a count other than the server's own `usage`),
is compared as text: with the judge's text, and where the server strips special tokens from its text (transformers
serve does), with the judge's text without them, the server's token count standing in for what was stripped."""

from __future__ import annotations

import numpy as np

# how a generation was matched (None: by its own token ids)
TEXT = "text"  # the server's text is the judge's text for the judge's tokens
TEXT_NO_SPECIAL = "text without special tokens"  # equal once the judge's special tokens are dropped, count equal
UNRESOLVED = "unresolved"


def resolve(tok, tokens: list[int], eg, prefix: bool = False) -> str | None:
    """None when the engine's ids are its own; else TEXT or TEXT_NO_SPECIAL when its text matches the judge's for
    tokens (its ids are then set to tokens), or UNRESOLVED when it differs. prefix: the generation was cut by a stop
    check the server never saw (the batching part's staggered stops), so its text may run on past the judge's."""
    if eg.prompt_counted is not None and eg.prompt_counted != len(eg.prompt_ids):
        return UNRESOLVED  # the server read another token sequence: nothing after it is comparable as tokens
    if eg.ids_exact:
        return None
    if tok is None:
        return UNRESOLVED

    def same(want: str) -> bool:
        return eg.text == want or (prefix and eg.text.startswith(want))

    how = None
    if same(tok.decode(list(tokens))):
        how = TEXT
    elif same(tok.decode(list(tokens), skip_special=True)) and (
            eg.counted is None or prefix or eg.counted == len(tokens)):
        how = TEXT_NO_SPECIAL  # the special tokens' identity is unseen; their number is the server's count
    if how is None:
        return UNRESOLVED
    n = len(tokens)
    eg.token_ids, eg.ids_exact = list(tokens), True
    if len(eg.top_logprobs) != n:  # the server's per-token logprobs do not line up: drop them
        eg.top_logprobs = np.full((n, 1), np.nan, np.float32)
        eg.top_ids = np.full((n, 1), -1, np.int64)
    return how


NO_SPECIAL_NOTE = ("matched as text without special tokens (the server strips them from its text; their number is the "
                   "server's own count): which special token it generated is unseen")


def why_unresolved(eg) -> str:
    """Why an UNRESOLVED generation was not judged, in one line."""
    if eg.prompt_counted is not None and eg.prompt_counted != len(eg.prompt_ids):
        return (f"the server read the prompt as {eg.prompt_counted} tokens where the reference has "
                f"{len(eg.prompt_ids)}: not comparable token for token")
    return ("the server returned no token ids and its text differs from the reference's, and cannot be turned back "
            "into its own ids (not valid UTF-8, or not the token count the server reported): the difference cannot "
            "be located in tokens")
