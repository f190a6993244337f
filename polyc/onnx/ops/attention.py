"""Converters of the attention family: Attention (opsets 23-25) and RotaryEmbedding (23).

Attention is lowered as the statements a scheduler can fuse, in the idioms of
:func:`~polyc.onnx.ops.core.matmul` and :func:`~polyc.onnx.ops.core._softmax`::

    S(b, h, i, j)  +=! (Q(b, h, i, r) * s) * (K(b, h/rep, j, r) * s)        QK^T, s = sqrt(scale)
    M(b, h, i)     max=! allowed(b, h, i, j) ? L(b, h, i, j) : lowest        L = softcap(S) + float mask
    E(b, h, i, j)  = allowed ? exp(L - M) : 0
    Z(b, h, i)     +=! E(b, h, i, j)
    O(b, h, i, v)  +=! E(b, h, i, j) * V(b, h/rep, j, v)
    Y              = Z > 0 ? O / Z : 0                                       a fully-masked row gives 0

``allowed`` is an index/data predicate (is_causal, the sliding window, nonpad_kv_seqlen, a boolean mask, a mask
shorter than the key sequence) rather than an additive ``-inf``, so no infinity enters the arithmetic.
3-D inputs ``(batch, seq, heads * head_size)`` are read through index arithmetic (no transposed copies); a
past key/value cache is concatenated by a statement that is also the present_key/present_value output.
The semantics follow the ONNX spec of Attention-23/24/25 and its reference implementation (which the backend
test data was made with).
"""
from __future__ import annotations

import numpy as np

from ..builder import Builder, broadcast_index, lazy, lit, tc_type
from .common import attr, lowest, zero

#: softmax_precision values (TensorProto element types) polyc computes in.
_PRECISION = {1: np.dtype(np.float32), 11: np.dtype(np.float64)}


def _conv(text: str, src, dst) -> str:
    return text if np.dtype(src) == np.dtype(dst) else f"{tc_type(dst)}({text})"


def _heads_view(v, heads: int | None):
    """(read(b, h, s, d), (B, H, S, D)) of a 4-D input, or of a 3-D ``(B, S, H*D)`` one split into ``heads``."""
    if len(v.shape) == 4:
        return (lambda bb, h, s, d: v.at([bb, h, s, d])), tuple(v.shape)
    bsz, seq, hidden = v.shape
    dh = hidden // heads

    def read(bb, h, s, d):
        return v.at([bb, s, d if heads == 1 else (f"{dh}*({h})+{d}" if dh > 1 else h)])
    return read, (bsz, heads, seq, dh)


def attention(b: Builder, node):
    """Attention-23/24/25: scaled dot-product attention with MHA/GQA/MQA heads.

    Inputs Q ``(B, Hq, Sq, D)`` or ``(B, Sq, Hq*D)``, K ``(B, Hkv, Skv, D)``, V ``(B, Hkv, Skv, Dv)`` (3-D
    forms need q_num_heads/kv_num_heads), optional attn_mask (bool: True attends; float: added; broadcast to
    ``(B, Hq, Sq, T)``, a shorter last dim padded as masked), past_key/past_value ``(B, Hkv, P, D|Dv)``,
    nonpad_kv_seqlen ``(B,)`` (24+). Attributes scale (default ``1/sqrt(D)``, applied as ``sqrt(scale)`` to Q
    and K), is_causal (bottom-right: key ``j <= i + offset``, offset the past length or ``nonpad - Sq``),
    softcap, left_window_size/right_window_size (25), qk_matmul_output_mode 0-3, softmax_precision (float or
    double). Outputs Y, present_key, present_value, qk_matmul_output. Float32/float64 only.
    """
    q_in, k_in, v_in = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    mask, past_k, past_v = b.input(node, 3), b.input(node, 4), b.input(node, 5)
    nonpad = b.input(node, 6)
    t = q_in.dtype
    rank = len(q_in.shape)
    if rank not in (3, 4) or len(k_in.shape) != rank or len(v_in.shape) != rank:
        raise b.error("Q, K and V must all be 3-D or all 4-D")
    hq_attr, hkv_attr = attr(node, "q_num_heads", None), attr(node, "kv_num_heads", None)
    if rank == 3 and (not hq_attr or not hkv_attr):
        raise b.error("3-D Q, K, V need the q_num_heads and kv_num_heads attributes")
    if rank == 3 and (q_in.shape[2] % hq_attr or k_in.shape[2] % hkv_attr or v_in.shape[2] % hkv_attr):
        raise b.error("the hidden sizes of Q, K, V are not multiples of q_num_heads / kv_num_heads")
    q, (bsz, hq, sq, dq) = _heads_view(q_in, hq_attr)
    k, (_, hkv, skv, dk) = _heads_view(k_in, hkv_attr)
    v, (_, _, _, dv) = _heads_view(v_in, hkv_attr)
    if dq != dk or hq % hkv:
        raise b.error(f"head sizes {dq} (Q) and {dk} (K) differ, or {hq} query heads are not a multiple of "
                      f"{hkv} key/value heads")
    if (past_k is None) != (past_v is None):
        raise b.error("past_key and past_value must be given together")
    if nonpad is not None and past_k is not None:
        raise b.error("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    rep = hq // hkv
    past = past_k.shape[2] if past_k is not None else 0
    total = past + skv

    # the key/value cache: present = concat(past, new) along the sequence, a statement (it may be an output)
    if past_k is not None:
        def concat(pv, read, d):
            return b.emit((bsz, hkv, total, d), t, lambda idx, red: (
                f"({idx[2]} < {past}) ? {pv.at(idx)} : {read(idx[0], idx[1], f'{idx[2]}-{past}', idx[3])}"))
        pk, pv_ = concat(past_k, k, dk), concat(past_v, v, dv)

        def k(bb, h, s, d):
            return pk.at([bb, h, s, d])

        def v(bb, h, s, d):
            return pv_.at([bb, h, s, d])
        presents = [pk, pv_]
    else:
        presents = [lazy((bsz, hkv, total, dk), t, lambda idx: k(*idx), cheap=True),
                    lazy((bsz, hkv, total, dv), t, lambda idx: v(*idx), cheap=True)]

    scale = attr(node, "scale", None)
    scale = 1.0 / np.sqrt(dq) if scale is None else scale
    s = lit(np.sqrt(np.float64(scale)).astype(t), t)

    def kv_head(h):
        return h if rep == 1 else f"{h}/{rep}"

    full = (bsz, hq, sq, total)
    scores = b.emit(full, t, lambda idx, red: (
        f"({q(idx[0], idx[1], idx[2], red[0])} * {s}) * ({k(idx[0], kv_head(idx[1]), idx[3], red[0])} * {s})"),
        "+=!", [dq])
    softcap = attr(node, "softcap", 0.0)

    def capped(idx):
        if softcap and softcap > 0:
            c = lit(softcap, t)
            return f"({c} * tanh({scores.at(idx)} / {c}))"
        return scores.at(idx)

    # the mask: a float one is added, a boolean one (and a short last dim) restricts ``allowed``
    is_bool = mask is not None and np.dtype(mask.dtype).kind == "b"
    if mask is not None and np.dtype(mask.dtype).kind not in "bf":
        raise b.error(f"attn_mask of dtype {np.dtype(mask.dtype).name} is neither bool nor float")
    m_len = mask.shape[-1] if mask is not None else total
    if m_len > total:
        raise b.error(f"attn_mask's last dim {m_len} is longer than the key sequence {total}")

    def mask_at(idx):
        return mask.at(broadcast_index(mask, full[:3] + (m_len,), idx))

    def offset(idx):
        if nonpad is not None:
            return f"{nonpad.at([idx[0]])} - {sq}"
        return str(past)

    causal = attr(node, "is_causal", 0)
    left, right = attr(node, "left_window_size", -1), attr(node, "right_window_size", -1)

    def allowed(idx):
        """(affine conditions, data-dependent conditions) for key ``j`` to be attended: two lists, so a
        ``?:`` can test the affine ones first (they guard the mask's reads, see :func:`masked`)."""
        i, j = idx[2], idx[3]
        affine, data = [], []
        if m_len < total:
            affine.append(f"{j} < {m_len}")
        if is_bool:
            data.append(mask_at(idx))
        off = offset(idx)
        conds = data if nonpad is not None else affine
        if causal:
            conds.append(f"{j} <= {i} + {off}" if off != "0" else f"{j} <= {i}")
        if left is not None and left >= 0:
            conds.append(f"{i} + {off} - {j} <= {left}")
        if right is not None and right >= 0:
            conds.append(f"{j} - {i} - {off} <= {right}")
        if nonpad is not None:
            data.append(f"{j} < {nonpad.at([idx[0]])}")
        return affine, data

    def biased(idx):
        e = capped(idx)
        if mask is not None and not is_bool:
            e = f"({e} + {mask_at(idx)})"
        return e

    sp = attr(node, "softmax_precision", None)
    st = _PRECISION.get(sp, np.dtype(t)) if sp is not None else np.dtype(t)
    row = (bsz, hq, sq)

    def logit(idx):
        return _conv(biased(idx), t, st)

    def masked(idx, value, otherwise):
        """``value`` where key ``idx[3]`` is attended, else ``otherwise``: nested ``?:``, affine test outside."""
        affine, data = allowed(idx)
        if data:
            value = f"(({' && '.join(data)}) ? {value} : {otherwise})"
        if affine:
            value = f"(({' && '.join(affine)}) ? {value} : {otherwise})"
        return value

    mx = b.emit(row, st, lambda idx, red: masked(idx + red, logit(idx + red), lowest(st)), "max=!", [total])
    ex = b.emit(full, st, lambda idx, red: masked(idx, f"exp({logit(idx)} - {mx.at(idx[:3])})", zero(st)))
    z = b.emit(row, st, lambda idx, red: ex.at(idx + red), "+=!", [total])
    # as the spec's function body, the probabilities return to T before the product with V
    o = b.emit((bsz, hq, sq, dv), t, lambda idx, red: (
        f"{_conv(ex.at(idx[:3] + red), st, t)} * {v(idx[0], kv_head(idx[1]), red[0], idx[3])}"), "+=!", [total])

    def y4(idx):
        zz = z.at(idx[:3])
        return f"({zz} > {zero(st)} ? {o.at(idx)} / {_conv(zz, st, t)} : {zero(t)})"
    if rank == 4:
        y = lazy((bsz, hq, sq, dv), t, y4)
    else:
        def y3(idx):
            c = idx[2]
            return y4([idx[0], c if dv == 1 else f"{c}/{dv}", idx[1], "0" if dv == 1 else f"{c}%{dv}"])
        y = lazy((bsz, sq, hq * dv), t, y3)

    mode = attr(node, "qk_matmul_output_mode", 0)
    if mode == 0:  # the raw product, as the spec and onnxruntime (onnx's reference gives the softcapped one)
        qk = lazy(full, t, lambda idx: scores.at(idx), cheap=True)
    elif mode == 1:
        qk = lazy(full, t, capped)
    elif mode == 2:
        def with_bias(idx):
            return masked(idx, biased(idx), f"({lit(-1.0, t)} / {zero(t)})")  # -inf where masked
        qk = lazy(full, t, with_bias)
    elif mode == 3:
        def probs(idx):
            zz = z.at(idx[:3])
            return _conv(f"({zz} > {zero(st)} ? {ex.at(idx)} / {zz} : {zero(st)})", st, t)
        qk = lazy(full, t, probs)
    else:
        raise b.error(f"unsupported qk_matmul_output_mode={mode}")
    return [y] + presents + [qk]


def rotary_embedding(b: Builder, node):
    """RotaryEmbedding-23: rotate pairs of X's head dims by the cached angles.

    X ``(B, H, S, D)`` or ``(B, S, H*D)`` (then num_heads is needed); cos_cache/sin_cache ``(P, R/2)`` read
    at position_ids ``(B, S)`` (negative ids count from the end) or, without position_ids, ``(B, S, R/2)``.
    The first ``R = rotary_embedding_dim`` (default D) dims rotate: halves ``(d, d + R/2)`` or, interleaved,
    pairs ``(2k, 2k + 1)``: ``x1 cos - x2 sin``, ``x1 sin + x2 cos``; the rest pass through.
    """
    x, cos_c, sin_c, pos = (b.input(node, k) for k in range(4))
    x = b.simple(x)
    t = x.dtype
    rank = len(x.shape)
    if rank == 4:
        _, _, seq, dh = x.shape
    elif rank == 3:
        heads = attr(node, "num_heads", 0)
        if not heads or x.shape[2] % heads:
            raise b.error("3-D X needs a num_heads attribute that divides its hidden size")
        seq, dh = x.shape[1], x.shape[2] // heads
    else:
        raise b.error("X must be 3-D or 4-D")
    rdim = attr(node, "rotary_embedding_dim", 0) or dh
    if rdim % 2 or rdim > dh:
        raise b.error(f"rotary_embedding_dim {rdim} must be even and at most the head size {dh}")
    half = rdim // 2
    if cos_c.shape[-1] != half or sin_c.shape[-1] != half:
        raise b.error(f"the cos/sin caches' last dim must be rotary_embedding_dim/2 = {half}")
    want = (2 if pos is not None else 3)
    if len(cos_c.shape) != want or cos_c.shape != sin_c.shape or \
            (pos is None and tuple(cos_c.shape[:2]) != (x.shape[0], seq)):
        raise b.error(f"the cos/sin caches {list(cos_c.shape)}, {list(sin_c.shape)} should be "
                      + ("(max_position, R/2)" if pos is not None else f"({x.shape[0]}, {seq}, R/2)"))
    interleaved = attr(node, "interleaved", 0)
    npos = cos_c.shape[0]

    def split(idx):
        """(batch, seq, index prefix/suffix builder, head dim) of an output index."""
        if rank == 4:
            return idx[0], idx[2], (lambda d: idx[:3] + [d]), idx[3]
        c = idx[2]
        hd = f"{c}/{dh}" if dh > 1 else c
        d = f"{c}%{dh}" if dh > 1 else "0"
        return idx[0], idx[1], (lambda dd: [idx[0], idx[1], f"{dh}*({hd})+{dd}" if dh > 1 else idx[2]]), d

    def cache(c, bb, s, k):
        if pos is None:
            return c.at([bb, s, k])
        p = pos.at([bb, s])
        return c.at([f"({p} < 0 ? {p} + {npos} : {p})", k])

    def text(idx):
        bb, s, at, d = split(idx)
        xd = x.at(at(d))
        if interleaved:
            k = f"{d}/2"
            cs, sn = cache(cos_c, bb, s, k), cache(sin_c, bb, s, k)
            even = f"({cs} * {xd} - {sn} * {x.at(at(f'{d}+1'))})"
            odd = f"({sn} * {x.at(at(f'{d}-1'))} + {cs} * {xd})"
            rot = f"(({d}) % 2 == 0 ? {even} : {odd})"
        else:
            lo = f"({cache(cos_c, bb, s, d)} * {xd} - {cache(sin_c, bb, s, d)} * {x.at(at(f'{d}+{half}'))})"
            k = f"{d}-{half}"
            hi = f"({cache(sin_c, bb, s, k)} * {x.at(at(k))} + {cache(cos_c, bb, s, k)} * {xd})"
            rot = f"({d} < {half} ? {lo} : {hi})"
        return rot if rdim == dh else f"({d} < {rdim} ? {rot} : {xd})"
    return [lazy(x.shape, t, text)]


CONVERTERS = {
    "Attention": ((23, attention),),
    "RotaryEmbedding": ((23, rotary_embedding),),
}

KNOWN_ATTRS = {
    "Attention": {"is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale", "softcap",
                  "softmax_precision", "left_window_size", "right_window_size"},
    "RotaryEmbedding": {"interleaved", "num_heads", "rotary_embedding_dim"},
}

SUPPORTED_VALUES = {
    "Attention": {"softmax_precision": lambda v: v in _PRECISION, "qk_matmul_output_mode": lambda v: v in (0, 1, 2, 3),
                  "left_window_size": lambda v: v >= -1, "right_window_size": lambda v: v >= -1},
}

CONSTANT_INPUTS = {}
