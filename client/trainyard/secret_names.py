"""Names that stand for credentials (``hf_token``, ``WANDB_API_KEY``, ``--password``).

Contract: ``looks_secret(name)`` is True when a word of ``name`` (split at ``_``, ``-``,
``.``, ``/`` and camelCase, case ignored) is a credential's (``token``, ``secret``,
``password``, ``passwd``, ``credential(s)``) or two adjacent words are ``api key``,
``access key``, ``private key`` or ``secret key``. Whole words only, so ``max_tokens``,
``tokenizer`` and ``secretary`` are not. Pure standard library.
"""

from __future__ import annotations

import itertools
import re

_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_SECRET_WORDS = frozenset({"token", "secret", "password", "passwd", "credential", "credentials"})
_SECRET_PAIRS = frozenset(
    {("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key")}
)


def looks_secret(name: str) -> bool:
    """Whether ``name`` names a credential (see the module)."""
    words = [w.lower() for w in _WORDS.findall(name)]
    if any(w in _SECRET_WORDS for w in words):
        return True
    # "apikey" written as one word counts as the pair.
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words)) or any(
        "".join(pair) in words for pair in _SECRET_PAIRS
    )
