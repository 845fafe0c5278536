"""The ONE list of contract checks a variant is known to fail, with where the fix is.

Every case is ``xfail(strict=True)``: when a fix lands, the test XPASSes, the suite fails, and the
entry must be deleted here. Keys are ``(check, variant)``; checks are named in the contract tests
(``tests/test_attention_contract.py``, ``test_fuzz_attention.py``, ``test_pooling_reach.py``,
``test_attention_bf16.py``).
"""
from __future__ import annotations

import pytest

from attention.registry import variant_names

_DRAWS_BY_SHAPE = ("draws its random choices by the shape of the batch (position in a [B, N] draw), "
                   "so they follow the padded length and the other rows; fixed on branch ref_papers")
_REFORMER_BUCKETS = ("n_buckets = ceil(N / bucket_size) uses the padded N, so the hashing (and the "
                     "output) follows the padding; fixed on branch ref_baselines")
_ROUTING_CLUSTER_SIZE = ("routing.py _route: w = min(n, ceil(n / n_clusters)) takes the cluster size "
                         "from the PADDED length n, so top-w membership follows the padding "
                         "(proposed fix: w = min(n, ceil(max_len / n_clusters)))")

_BIGBIRD_GLOBAL_LAST = ("bigbird.py _table/random_blocks: the last global block (nb - 1) and the random-block "
                        "candidates come from the PADDED block count nb, so at a longer padding the second "
                        "global block is padding, the real last block loses its global role and the random "
                        "plan changes (proposed fix: per sample, nb_real = ceil(length / block_size) for the "
                        "global block and the random candidates)")

KNOWN_FAILURES: dict[tuple[str, str], str] = {
    # same sequence padded to N and to 2N (test_attention_contract.test_padded_length_invariance)
    ("padded_length_eval", "reformer"): _REFORMER_BUCKETS,
    ("padded_length_train", "reformer"): _REFORMER_BUCKETS,
    ("padded_length_eval", "abc_rd"): _DRAWS_BY_SHAPE,
    ("padded_length_train", "abc_rd"): _DRAWS_BY_SHAPE,
    ("padded_length_eval", "adamra_random_router"): _DRAWS_BY_SHAPE,
    ("padded_length_train", "adamra_random_router"): _DRAWS_BY_SHAPE,
    ("padded_length_eval", "routing"): _ROUTING_CLUSTER_SIZE,
    ("padded_length_train", "routing"): _ROUTING_CLUSTER_SIZE,
    ("padded_length_eval", "bigbird"): _BIGBIRD_GLOBAL_LAST,
    ("padded_length_train", "bigbird"): _BIGBIRD_GLOBAL_LAST,
    # a row alone vs inside a batch (test_attention_contract.test_batch_independence)
    ("batch_independence", "abc_rd"): _DRAWS_BY_SHAPE,
    ("batch_independence", "adamra_random_router"): _DRAWS_BY_SHAPE,
    # the same through the network (test_pooling_reach.test_logits_independent_of_the_rest_of_the_batch)
    ("network_batch_independence", "abc_rd"): _DRAWS_BY_SHAPE,
    ("network_batch_independence", "adamra_random_router"): _DRAWS_BY_SHAPE,
    # every real token reaches the logits (test_pooling_reach)
    ("reach_cls", "memformer"): ("the CLS token sits in the first segment and reads only the memory "
                                 "written before it, so later segments never reach it; fixed on branch memformer"),
    # bfloat16 (test_attention_bf16)
    ("bf16_cast", "bigbird"): ("the random block plan changes when the mixer is cast to bfloat16; "
                               "fixed on branch ref_baselines"),
    ("bf16_autocast", "routing"): ("routing.py _route: top = torch.full(..., dtype=q.dtype) is float32 "
                                   "while lse is bfloat16 under autocast, and scatter_reduce refuses mixed "
                                   "dtypes (proposed fix: dtype=lse.dtype)"),
}


def variant_cases(check: str, names: list[str] | None = None) -> list:
    """``pytest.param`` per variant, the known failures of ``check`` marked strict xfail."""
    params = []
    for name in names if names is not None else variant_names():
        reason = KNOWN_FAILURES.get((check, name))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params
