"""Per-variant settings under which the contract tests' 37-74 tokens span several blocks, segments,
clusters, landmarks or buckets: each class's ``spec.small`` (attention/spec.py), read through
:data:`lra.checks.contract.SMALL_STRUCTURE` (the variant check, ``python run.py mode=check``, runs at
the same sizes)."""
from __future__ import annotations

from lra.checks.contract import SMALL_STRUCTURE  # noqa: F401
