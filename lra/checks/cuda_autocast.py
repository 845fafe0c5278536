"""CUDA autocast's dtype policy, emulated by CPU autocast (for tests on a machine without a GPU).

CPU autocast keeps ``sum``, ``softmax``, ``exp``, ``layer_norm`` and most reductions in bfloat16 /
float16, while CUDA autocast runs them in float32; CPU promotes ``cat``/``stack``/``index_copy``,
CUDA does not; CPU puts linear algebra and losses on its float32 list, CUDA leaves them alone. Code
that is dtype-correct under CPU autocast can therefore fail under CUDA autocast (an in-place add of
a float32 reduction into a bfloat16 buffer, say), and nothing on a CPU machine would run it.

:func:`cuda_autocast_policy` replaces, for its duration, the CPU autocast kernel of every op that
either device lists with CUDA's policy for that op (``torch.library`` registrations at the
``AutocastCPU`` dispatch key, removed on exit):

* ``lower_precision_fp`` (matmuls, linear, convolutions, attention): floating inputs cast to the
  autocast dtype;
* ``fp32`` (``exp``, ``log``, ``pow``, ``layer_norm``, losses, ...): floating inputs cast to float32;
* ``fp32_set_opt_dtype`` (``sum``, ``softmax``, ``log_softmax``, ``cumsum``, ``prod``, norms):
  run with ``dtype=float32`` unless the caller gave a dtype;
* ``fp32_append_dtype`` (``norm``): the overload with ``dtype=float32``;
* ``promote`` (``addcmul``, ``index_put``, ``scatter_add``, ...): inputs cast to the widest type;
* ops only CPU lists: no cast (``fallthrough``), as on CUDA.

Like CUDA's, these kernels run whenever autocast is enabled for the device, so also inside the
backward of a custom autograd Function that re-enters the forward's autocast
(:func:`attention.base.autocast_as`). The op lists are PyTorch's (``aten/src/ATen/autocast_mode.h``
and ``autocast_mode.cpp``); an overload this torch build lacks is skipped (:data:`SKIPPED`).
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import torch

# CUDA autocast (AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE,
# AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE, AT_FORALL_PROMOTE; "op" or "op.overload")
CUDA_LOWER_PRECISION = (
    "_convolution.deprecated _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d.input "
    "conv_transpose3d.input convolution prelu addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm "
    "baddbmm bmm chain_matmul linalg_multi_dot _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell "
    "rnn_tanh_cell rnn_relu_cell _scaled_dot_product_flash_attention scaled_dot_product_attention"
).split()
CUDA_FP32 = (
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow.Tensor_Scalar "
    "pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm group_norm frobenius_norm.dim "
    "nuclear_norm nuclear_norm.dim cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d "
    "hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss "
    "multilabel_margin_loss soft_margin_loss triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits "
    "dist pdist cdist renorm logsumexp upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d "
    "_upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d "
    "_upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d _upsample_bicubic2d_aa"
).split()
CUDA_FP32_SET_OPT_DTYPE = (
    "prod prod.dim_int prod.dim_Dimname softmax.int softmax.Dimname log_softmax.int log_softmax.Dimname cumprod "
    "cumprod.dimname cumsum cumsum.dimname linalg_vector_norm linalg_matrix_norm linalg_matrix_norm.str_ord sum "
    "sum.dim_IntList sum.dim_DimnameList"
).split()
CUDA_FP32_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
                          "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype"}
CUDA_PROMOTE = "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add".split()
# CPU autocast's own lists (autocast_mode.cpp, AutocastCPU): what CUDA does not list runs uncast.
CPU_ONLY = (
    "conv1d.padding conv2d.padding conv3d.padding _addmm_activation mkldnn_rnn_layer _native_multi_head_attention "
    "avg_pool3d binary_cross_entropy polar quantile quantile.scalar nanquantile nanquantile.scalar stft stft.center "
    "grid_sampler_2d _grid_sampler_2d_cpu_fallback grid_sampler_3d trace view_as_complex cholesky cholesky_inverse "
    "cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d max_unpool2d max_unpool3d adaptive_avg_pool3d "
    "reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d replication_pad3d cross_entropy_loss "
    "ctc_loss.IntList ctc_loss.Tensor fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn fft_rfft fft_irfft "
    "fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft fft_ihfft linalg_cond linalg_cond.p_str linalg_matrix_rank "
    "linalg_matrix_rank.tol_tensor linalg_matrix_rank.atol_rtol_tensor linalg_matrix_rank.atol_rtol_float "
    "linalg_solve linalg_cholesky linalg_svdvals linalg_eigvals linalg_eigvalsh linalg_inv linalg_householder_product "
    "linalg_tensorinv linalg_tensorsolve fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd triangular_solve "
    "fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d multilabel_margin_loss_forward linalg_qr "
    "linalg_cholesky_ex linalg_svd linalg_eig linalg_eigh linalg_lstsq linalg_inv_ex stack cat index_copy "
    "index_copy.dimname"
).split()

_BELOW_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
SKIPPED: list[str] = []   # overloads this torch build does not have


def _overload(name: str):
    op, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, op, None)
    if packet is None or (overload or "default") not in packet.overloads():
        return None
    return getattr(packet, overload or "default")


def _eligible(t: Any) -> bool:
    """What autocast casts: a floating tensor of the device, not float64."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 and t.device.type == "cpu"


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if _eligible(value):
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _floating(value: Any) -> list[torch.Tensor]:
    if _eligible(value):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _floating(v)]
    return []


def _kernel(op, policy: str, redispatch=None):
    """CUDA's cast ``policy`` for ``op``, as a Python kernel of the ``AutocastCPU`` key."""
    dtype_pos = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype" and not a.kwarg_only), None)

    def kernel(*args, **kwargs):
        low = torch.get_autocast_dtype("cpu")
        with torch._C._ExcludeDispatchKeyGuard(_BELOW_AUTOCAST):
            if policy == "lower_precision_fp":
                return op(*_cast(args, low), **{k: _cast(v, low) for k, v in kwargs.items()})
            if policy == "fp32":
                return op(*_cast(args, torch.float32), **{k: _cast(v, torch.float32) for k, v in kwargs.items()})
            if policy == "fp32_set_opt_dtype":
                if not (args and _eligible(args[0])):
                    return op(*args, **kwargs)
                if dtype_pos is not None and len(args) > dtype_pos:
                    if args[dtype_pos] is None:
                        args = (*args[:dtype_pos], torch.float32, *args[dtype_pos + 1:])
                elif kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
            if policy == "fp32_append_dtype":
                if not (args and _eligible(args[0])):
                    return op(*args, **kwargs)
                return redispatch(*args, **kwargs, dtype=torch.float32)
            # promote: the widest floating type among the eligible inputs, from the autocast dtype up
            wide = low
            for t in _floating(args) + _floating(list(kwargs.values())):
                wide = torch.promote_types(wide, t.dtype)
            return op(*_cast(args, wide), **{k: _cast(v, wide) for k, v in kwargs.items()})

    return kernel


@contextmanager
def cuda_autocast_policy() -> Iterator[None]:
    """Within the block, ``torch.autocast("cpu", dtype)`` casts as ``torch.autocast("cuda", dtype)``."""
    lib = torch.library.Library("aten", "IMPL")
    SKIPPED.clear()

    def register(name: str, policy: str | None, redispatch: str | None = None) -> None:
        op, target = _overload(name), _overload(redispatch) if redispatch else None
        if op is None or (redispatch and target is None):
            SKIPPED.append(name)
            return
        kernel = torch.library.fallthrough_kernel if policy is None else _kernel(op, policy, target)
        lib.impl(name, kernel, "AutocastCPU")

    try:
        with warnings.catch_warnings():   # "overriding a previously registered kernel": that is the point
            warnings.simplefilter("ignore")
            for name in CPU_ONLY:
                register(name, None)
            for names, policy in ((CUDA_LOWER_PRECISION, "lower_precision_fp"), (CUDA_FP32, "fp32"),
                                  (CUDA_FP32_SET_OPT_DTYPE, "fp32_set_opt_dtype"), (CUDA_PROMOTE, "promote")):
                for name in names:
                    register(name, policy)
            for name, target in CUDA_FP32_APPEND_DTYPE.items():
                register(name, "fp32_append_dtype", target)
        yield
    finally:
        lib._destroy()
