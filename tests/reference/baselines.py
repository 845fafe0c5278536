"""Float64 references of the baseline attention variants, written from each paper's equations.

Independent of ``attention/*``: dense N x N masks and plain loops, no block tables, sorting tricks
or factorised products. They take the module's parameters and random draws (LSH rotations, random
features, the BigBird priorities, Sinkhorn's Gumbel draws) as explicit arguments, so a test can
compare values and autograd gradients exactly. Shapes: ``q, k, v [B, H, N, D]``, ``mask [B, N]``
(True = real token), ``x [B, N, H*D]``. Every function returns ``[B, H, N, D]`` with padded query
rows zero.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


# ----------------------------------------------------------------------------- shared pieces
def masked_softmax(scores: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over the allowed entries of the last dim; a row with none gives zeros (and finite grads)."""
    shape = torch.broadcast_shapes(scores.shape, allowed.shape)
    scores, allowed = scores.expand(shape), allowed.expand(shape)
    some = allowed.any(dim=-1, keepdim=True)
    s = scores.masked_fill(~allowed, float("-inf")).masked_fill(~some, 0.0)
    return torch.softmax(s, dim=-1) * some


def rows(out: Tensor, mask: Tensor) -> Tensor:
    return out * mask[:, None, :, None]


def pattern_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, allowed: Tensor | None = None) -> Tensor:
    """Eq. 1 of Vaswani et al. restricted to ``allowed`` (broadcastable to ``[B, H, N, N]``) and real keys
    (Child et al. eq. 2: attention over a connectivity pattern S_i)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    ok = mask[:, None, None, :]
    if allowed is not None:
        ok = ok & allowed
    return rows(masked_softmax(scores, ok) @ v, mask)


def pairs(n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    i = torch.arange(n, device=device)
    return i[:, None], i[None, :]


# ----------------------------------------------------------------------------- fixed patterns
def local_allowed(n: int, block: int, window: int, device: torch.device) -> Tensor:
    """Blocks aligned at 0; block a sees blocks a-window .. a+window."""
    i, j = pairs(n, device)
    return (i // block - j // block).abs() <= window


def longformer_allowed(n: int, window: int, device: torch.device) -> Tensor:
    """Beltagy et al. Sec. 3.1: band of w/2 per side, token 0 global both ways."""
    i, j = pairs(n, device)
    return ((i - j).abs() <= window // 2) | (i == 0) | (j == 0)


def sparse_allowed(n: int, kind: str, stride: int, summary: int, device: torch.device) -> Tensor:
    """Child et al. Sec. 4.3, bidirectional, merged: strided A1 u A2 or fixed A1 u A2."""
    i, j = pairs(n, device)
    if kind == "strided":
        return ((i - j).abs() <= stride) | ((i - j) % stride == 0)
    c = min(summary, stride)
    return (i // stride == j // stride) | (j % stride >= stride - c)


def bigbird_allowed(mask: Tensor, block: int, window_blocks: int, n_random: int, priority: Tensor) -> Tensor:
    """Zaheer et al. App. D (ITC) per sample ``[B, H, N, N]``: window blocks, the first and the last
    (real) block global both ways, and per head and query block the ``n_random`` highest-priority blocks
    among those neither in its window nor global. ``priority [H, nb_max, nb_max]`` is the module's draw."""
    b, n = mask.shape
    h = priority.shape[0]
    w = window_blocks // 2
    out = torch.zeros(b, h, n, n, dtype=torch.bool, device=mask.device)
    pos = torch.arange(n, device=mask.device)
    for s in range(b):
        real = pos[mask[s]]
        if len(real) == 0:
            continue
        nb = math.ceil((int(real.max()) + 1) / block)
        for hh in range(h):
            for a in range(nb):
                if a in (0, nb - 1):
                    reads = set(range(nb))
                else:
                    reads = {c for c in range(nb) if abs(a - c) <= w} | {0, nb - 1}
                    cands = [c for c in range(nb) if abs(a - c) > w and c not in (0, nb - 1)]
                    cands.sort(key=lambda c: -float(priority[hh, a, c]))
                    reads |= set(cands[:n_random])
                for c in reads:
                    out[s, hh, a * block:(a + 1) * block, c * block:(c + 1) * block] = True
    return out


# ----------------------------------------------------------------------------- kernels
def linear_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, eps: float) -> Tensor:
    """Katharopoulos et al. eq. 6 with phi = elu + 1 (eq. 7), materialised as a weight matrix."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    a = (phi_q @ phi_k.transpose(-1, -2)) * mask[:, None, None, :]
    return rows((a @ v) / (a.sum(-1, keepdim=True) + eps), mask)


def sqrt_len_linear_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, max_len: int) -> Tensor:
    """The unnormalised LRA port (Nystromformer authors' ``attention_linear.py``): phi(Q) and phi(K)
    each scaled by N^-1/4, N their fixed padded width (``max_len``), and no normaliser; materialised."""
    phi_q, phi_k = (F.elu(q) + 1) * max_len ** -0.25, (F.elu(k) + 1) * max_len ** -0.25
    a = (phi_q @ phi_k.transpose(-1, -2)) * mask[:, None, None, :]
    return rows(a @ v, mask)


def performer_features(x: Tensor, w: Tensor, kernel: str, eps: float, shift: Tensor | None, scale: float) -> Tensor:
    """Choromanski et al. Lemma 1 (softmax kernel) or Sec. 2.2 (f = relu) on x * scale (d^-1/4).

    Softmax kernel: phi(x) = (exp(W x - |x|^2/2 - shift) + eps) / sqrt(m), with the documented
    stabiliser ``shift`` (detached; it cancels in the normalised output when eps = 0).
    ReLU: phi(x) = relu(W x) / sqrt(m) + eps.
    """
    m, d = w.shape
    x = x * scale
    proj = x @ w.T
    if kernel == "relu":
        return F.relu(proj) / math.sqrt(m) + eps
    return (torch.exp(proj - 0.5 * (x * x).sum(-1, keepdim=True) - shift) + eps) / math.sqrt(m)


def performer_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, w: Tensor, kernel: str, eps: float,
                        twice: bool = False, port_width: int | None = None) -> Tensor:
    """out_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j) over real keys j (FAVOR+, Sec. 2.2).

    Stabilisers as documented in attention/performer.py: per query the max of its W q / d^1/4, for
    keys one max per (sample, head) over real keys and features.

    The Nystromformer authors' LRA port, literally: ``twice``, q and k divided by d^1/4 before
    the feature map's own d^-1/4; ``port_width``, the batch zero-padded to that width with K and V
    multiplied by the mask, and every one of its keys real (in the stabiliser and the normaliser).
    """
    n, d = q.shape[2], q.shape[-1]
    scale = d ** (-0.5 if twice else -0.25)
    if port_width is not None:
        grow = (0, 0, 0, port_width - n)
        q = F.pad(q, grow)
        k = F.pad(k * mask[:, None, :, None], grow)
        v = F.pad(v * mask[:, None, :, None], grow)
        keys = torch.ones(q.shape[0], port_width, dtype=torch.bool, device=q.device)
    else:
        keys = mask
    if kernel == "relu":
        sq = sk = None
    else:
        sq = ((q * scale) @ w.T).detach().amax(-1, keepdim=True)
        per_key = ((k * scale) @ w.T).detach().amax(-1).masked_fill(~keys[:, None, :], float("-inf")).amax(-1)
        sk = torch.where(torch.isfinite(per_key), per_key, torch.zeros_like(per_key))[..., None, None]
    phi_q = performer_features(q, w, kernel, eps, sq, scale)
    phi_k = performer_features(k, w, kernel, eps, sk, scale)
    a = (phi_q @ phi_k.transpose(-1, -2)) * keys[:, None, None, :]
    den = a.sum(-1, keepdim=True)
    den = torch.where(den > 0, den, torch.ones_like(den))
    return rows(((a @ v) / den)[:, :, :n], mask)


# ----------------------------------------------------------------------------- projections
def linformer_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, e: Tensor, f: Tensor) -> Tensor:
    """Wang et al. eq. 7: softmax(Q (E^T K)^T / sqrt(d)) F^T V, E, F the first N rows; padded K, V zeroed."""
    n = q.shape[2]
    keep = mask[:, None, :, None].to(q.dtype)
    kp = e[:n].T @ (k * keep)                 # [B, H, k, D]
    vp = f[:n].T @ (v * keep)
    return rows(torch.softmax(q @ kp.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ vp, mask)


def nystrom_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, m: int, iterations: int,
                      conv: Tensor | None) -> Tensor:
    """Xiong et al. Sec. 3: softmax(Q K~^T) pinv(softmax(Q~ K~^T)) softmax(Q~ K^T) V (+ depthwise conv of V).

    Landmarks: the r-th real token of a sample is in segment floor(r m / n_real); empty segments get
    no weight and identity rows/columns in the core. pinv by the paper's iteration, Z_0 = A^T /
    (||A||_1 ||A||_inf) per sample and head.
    """
    b, h, n, d = q.shape
    scale = d ** -0.5
    seg = torch.zeros(b, m, n, dtype=q.dtype, device=q.device)
    for s in range(b):
        real = [i for i in range(n) if mask[s, i]]
        for r, i in enumerate(real):
            seg[s, (r * m) // len(real), i] = 1.0
    counts = seg.sum(-1)                                        # [B, m]
    valid = counts > 0
    avg = seg / counts.clamp_min(1)[..., None]
    q_l = avg[:, None] @ q                                      # [B, H, m, D]
    k_l = avg[:, None] @ k
    k1 = masked_softmax(q @ k_l.transpose(-1, -2) * scale, valid[:, None, None, :])
    k3 = masked_softmax(q_l @ k.transpose(-1, -2) * scale, mask[:, None, None, :]) * valid[:, None, :, None]
    a = masked_softmax(q_l @ k_l.transpose(-1, -2) * scale, valid[:, None, None, :])
    pair = (valid[:, :, None] & valid[:, None, :])[:, None]
    eye = torch.eye(m, dtype=q.dtype, device=q.device)
    a = torch.where(pair, a, eye)
    z = a.transpose(-1, -2) / (a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1))[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    vm = v * mask[:, None, :, None]
    out = k1 @ z @ k3 @ vm
    if conv is not None:
        width = conv.shape[-1]
        skip = torch.zeros_like(out)
        for t in range(width):
            off = t - width // 2                              # y_i += w_t v_{i + off}
            lo, hi = max(0, -off), min(n, n - off)
            if hi <= lo:                                      # a tap past either end of the sequence
                continue
            skip[:, :, lo:hi] = skip[:, :, lo:hi] + conv[None, :, t, None, None] * vm[:, :, lo + off:hi + off]
        out = out + skip
    return rows(out, mask)


# ----------------------------------------------------------------------------- reformer
def reformer_attention(q: Tensor, v: Tensor, mask: Tensor, rot: Tensor, n_buckets: int, chunk: int,
                       self_penalty: float) -> Tensor:
    """Kitaev et al. Sec. 2 and App. A, shared-QK, dense per round.

    ``rot [H, R, D, n_buckets/2]``. Round r: bucket h(k) = argmax([kR; -kR]) (padding: bucket
    n_buckets), rank by (bucket, position), chunk = rank // chunk; query i reads the keys j of its
    bucket in its own or the previous chunk (no wrap-around), logits q_i.k_j/sqrt(d) - log N_ij
    - penalty [i = j], N_ij the number of rounds putting i and j in one bucket. Rounds combined by
    softmax over their log-partition functions.
    """
    b, h, n, d = q.shape
    r = rot.shape[1]
    kn = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    logits = q @ kn.transpose(-1, -2) / math.sqrt(d)
    pos = torch.arange(n, device=q.device)
    buckets, chunks = [], []
    for rr in range(r):
        if n_buckets == 1:
            bkt = torch.zeros(b, h, n, dtype=torch.long, device=q.device)
        else:
            proj = torch.einsum("bhnd,hdk->bhnk", kn.detach(), rot[:, rr])
            bkt = torch.cat([proj, -proj], -1).argmax(-1)
        bkt = bkt.masked_fill(~mask[:, None, :], n_buckets)
        rank = (bkt * (n + 1) + pos).argsort(-1).argsort(-1)
        buckets.append(bkt)
        chunks.append(torch.div(rank, chunk, rounding_mode="floor"))
    count = sum((bk[..., :, None] == bk[..., None, :]).to(q.dtype) for bk in buckets)
    eye = torch.eye(n, dtype=torch.bool, device=q.device)
    outs, lses = [], []
    for bkt, ch in zip(buckets, chunks):
        dc = ch[..., :, None] - ch[..., None, :]
        ok = (bkt[..., :, None] == bkt[..., None, :]) & ((dc == 0) | (dc == 1)) & mask[:, None, None, :]
        s = logits - count.clamp_min(1).log() - self_penalty * eye
        some = ok.any(-1, keepdim=True)
        s = s.masked_fill(~ok, float("-inf")).masked_fill(~some, 0.0)
        outs.append(torch.softmax(s, -1) @ v)
        lses.append(torch.logsumexp(s, -1))
    wts = torch.softmax(torch.stack(lses), dim=0)[..., None]         # [R, B, H, N, 1]
    return rows((wts * torch.stack(outs)).sum(0), mask)


# ----------------------------------------------------------------------------- sinkhorn
def sinkhorn_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, block: int, sort_net: list[Tensor],
                       iterations: int, temperature: float, uniform: Tensor | None) -> Tensor:
    """Tay et al. 2020 (Sparse Sinkhorn), one block at a time.

    psi_j = mean of block j's real keys; R = W2 relu(W1 psi + b1) + b2 (cut to n_B columns); with
    ``uniform`` (training draws) Gumbel noise -log(-log u) is added; R / temperature; blocks without
    a real token get identity rows/columns; Sinkhorn: alternate row and column normalisation in log
    space. Block i attends (one softmax) over its real keys and the sorted slots t with real mass
    w_it = sum_j S_ij m_jt > 1e-6: key sum_j S_ij m_jt k_jt / w_it, logit bias log w_it.
    """
    b, h, n, d = q.shape
    nb = math.ceil(n / block)
    npad = nb * block
    pad = (0, 0, 0, npad - n)
    qp, kp, vp = F.pad(q, pad), F.pad(k, pad), F.pad(v, pad)
    mp = F.pad(mask, (0, npad - n), value=False).view(b, nb, block).to(q.dtype)
    kb = kp.view(b, h, nb, block, d) * mp[:, None, :, :, None]
    vb = vp.view(b, h, nb, block, d) * mp[:, None, :, :, None]
    qb = qp.view(b, h, nb, block, d)
    counts = mp.sum(-1)                                                      # [B, nb]
    psi = kb.sum(3) / counts.clamp_min(1)[:, None, :, None]
    w1, b1, w2, b2 = sort_net
    logits = (torch.relu(psi @ w1.T + b1) @ w2.T + b2)[..., :nb]          # [B, H, nb, nb]
    if uniform is not None:
        logits = logits - torch.log(-torch.log(uniform.clamp(1e-6, 1 - 1e-6)))
    logits = logits / temperature
    valid = counts > 0
    pair = (valid[:, :, None] & valid[:, None, :])[:, None]
    eye = torch.eye(nb, dtype=torch.bool, device=q.device)
    logits = torch.where(pair, logits, torch.where(eye, 0.0, float("-inf")).to(q.dtype))
    for _ in range(iterations):
        logits = logits - torch.logsumexp(logits, -1, keepdim=True)
        logits = logits - torch.logsumexp(logits, -2, keepdim=True)
    s = logits.exp()
    out = torch.zeros_like(qb)
    for i in range(nb):
        mass = torch.einsum("bhj,bjt->bht", s[:, :, i], mp)                   # [B, H, block]
        has = mass > 1e-6
        safe = torch.where(has, mass, torch.ones_like(mass))
        ks = torch.einsum("bhj,bhjtd->bhtd", s[:, :, i], kb) / safe[..., None]
        vs = torch.einsum("bhj,bhjtd->bhtd", s[:, :, i], vb) / safe[..., None]
        keys = torch.cat([kb[:, :, i], ks], 2)
        vals = torch.cat([vb[:, :, i], vs], 2)
        bias = torch.cat([torch.zeros_like(mass), safe.log()], -1)[:, :, None, :]
        ok = torch.cat([mp[:, None, i].bool().expand_as(has), has], -1)[:, :, None, :]
        scores = qb[:, :, i] @ keys.transpose(-1, -2) / math.sqrt(d) + bias
        out[:, :, i] = masked_softmax(scores, ok) @ vals
    return rows(out.view(b, h, npad, d)[:, :, :n], mask)


# ----------------------------------------------------------------------------- synthesizer
def dense_synthesizer(v: Tensor, mask: Tensor, x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """Tay et al. (Synthesizer) Sec. 3.1 per head h: B_i = W2_h relu(W1_h x_i + b1_h) + b2_h; softmax(B) V."""
    b, h, n, d = v.shape
    hid = torch.relu(x @ w1.T + b1)                       # [B, N, H*hidden]
    width = hid.shape[-1] // h
    logits = torch.stack([hid[..., hh * width:(hh + 1) * width] @ w2[hh, :, :n] + b2[hh, :n] for hh in range(h)], 1)
    return rows(masked_softmax(logits, mask[:, None, None, :]) @ v, mask)


def random_synthesizer(v: Tensor, mask: Tensor, r: Tensor) -> Tensor:
    """Sec. 3.2: softmax(R) V with R [H, N, N] (the first N rows/columns of the learned matrix)."""
    n = v.shape[2]
    return rows(masked_softmax(r[None, :, :n, :n], mask[:, None, None, :]) @ v, mask)
