"""Edits of a variant's code, planted in a forked ``run.py`` (``hook="tests.code_edits:<name>"``), for
the tests of what a run knows about its code (:mod:`lra.training.fingerprint`): one that changes
what softmax computes, as a planted bug would, and one that computes the same numbers another way,
as a refactor would."""
from __future__ import annotations

import torch.nn.functional as F

import attention.softmax as softmax


def changed_behaviour() -> None:
    """Softmax attention with its scale dropped (scores not divided by sqrt(d)): a plausible bug."""
    sdpa = F.scaled_dot_product_attention
    softmax.F = type("F", (), {"scaled_dot_product_attention": staticmethod(lambda q, k, v, **kw: sdpa(q, k, v, scale=1.0, **kw))})


def same_behaviour() -> None:
    """Softmax attention written out (scores, softmax, weighted sum) instead of the fused kernel:
    the same numbers within float rounding, by another path, as a refactor would."""
    from tests.training.test_fingerprint import explicit_attention

    softmax.F = type("F", (), {"scaled_dot_product_attention": staticmethod(explicit_attention)})
