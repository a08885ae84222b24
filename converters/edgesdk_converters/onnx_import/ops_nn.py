"""Layers: convolutions, pooling, normalization and the dense products (Gemm, MatMul)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .context import NodeContext, normalize_axis

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _spatial(ctx: NodeContext, rank: int) -> int:
    n = rank - 2
    if n not in _CONV:
        raise ctx.error(f"only 1-D, 2-D and 3-D {ctx.op} is supported; the input has rank {rank}")
    return n


def _ints(ctx: NodeContext, name: str, n: int, default: int) -> list[int]:
    value = list(ctx.attr(name, [default] * n))
    if len(value) != n:
        raise ctx.refuse(name, value, f"expected {n} values for {n} spatial dims")
    return value


def window_pads(ctx: NodeContext, sizes, kernel, strides, dilations) -> list[tuple[int, int]]:
    """(begin, end) padding per spatial dim from ``auto_pad`` and ``pads`` (Conv and pooling)."""
    n = len(sizes)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad not in _AUTO_PADS:
        raise ctx.refuse("auto_pad", auto_pad, f"expected one of {', '.join(_AUTO_PADS)}")
    if auto_pad == "VALID":
        return [(0, 0)] * n
    if auto_pad == "NOTSET":
        pads = list(ctx.attr("pads", [0] * 2 * n))
        if len(pads) != 2 * n or min(pads) < 0:
            raise ctx.refuse("pads", pads, f"expected {2 * n} non-negative values")
        return list(zip(pads[:n], pads[n:]))
    result = []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        result.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
    return result


def _explicit_pad(x, pads, value):
    """F.pad for (begin, end) pairs of the trailing spatial dims."""
    flat = [p for begin_end in reversed(pads) for p in begin_end]
    return F.pad(x, flat, value=value) if any(flat) else x


def conv(ctx: NodeContext):
    rank = len(ctx.shape(0))
    n = _spatial(ctx, rank)
    weight_shape = ctx.shape(1)
    kernel = list(ctx.attr("kernel_shape", weight_shape[2:]))
    strides, dilations = _ints(ctx, "strides", n, 1), _ints(ctx, "dilations", n, 1)
    pads = window_pads(ctx, ctx.shape(0)[2:], kernel, strides, dilations)
    x, w = ctx.tensor(0), ctx.tensor(1)
    bias = ctx.tensor(2) if ctx.has_input(2) else None
    if all(b == e for b, e in pads):
        padding = [b for b, _ in pads]
    else:
        x, padding = _explicit_pad(x, pads, 0.0), 0
    return _CONV[n](x, w, bias, strides, padding, dilations, ctx.attr("group", 1))


def conv_transpose(ctx: NodeContext):
    in_shape = ctx.shape(0)
    n = _spatial(ctx, len(in_shape))
    weight_shape = ctx.shape(1)
    kernel = list(ctx.attr("kernel_shape", weight_shape[2:]))
    strides, dilations = _ints(ctx, "strides", n, 1), _ints(ctx, "dilations", n, 1)
    out_pad = _ints(ctx, "output_padding", n, 0)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad not in _AUTO_PADS:
        raise ctx.refuse("auto_pad", auto_pad, f"expected one of {', '.join(_AUTO_PADS)}")
    output_shape = ctx.attr("output_shape")
    sizes = in_shape[2:]
    full = [(i - 1) * s + (k - 1) * d + 1 for i, s, k, d in zip(sizes, strides, kernel, dilations)]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape is None:
            output_shape = [i * s for i, s in zip(sizes, strides)]
        output_shape = list(output_shape)[-n:]
        pads = []
        for f, op, o in zip(full, out_pad, output_shape):
            total = f + op - o
            if total < 0 and op:
                raise ctx.refuse("output_shape", list(output_shape), "larger than the transposed convolution can produce")
            small, big = total // 2, total - total // 2
            # As onnxruntime does: SAME_UPPER puts the odd pixel at the end, otherwise at the start.
            pads.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
    elif auto_pad == "VALID":
        pads = [(0, 0)] * n
    else:
        flat = list(ctx.attr("pads", [0] * 2 * n))
        if len(flat) != 2 * n:
            raise ctx.refuse("pads", flat, f"expected {2 * n} values")
        pads = list(zip(flat[:n], flat[n:]))
    x, w = ctx.tensor(0), ctx.tensor(1)
    bias = ctx.tensor(2) if ctx.has_input(2) else None
    group = ctx.attr("group", 1)
    # litert-torch cannot lower torch's output_padding (an asymmetric lhs-dilated convolution): crop instead.
    if all(b == e and b >= 0 for b, e in pads) and not any(out_pad):
        return _CONV_T[n](x, w, bias, strides, [b for b, _ in pads], out_pad, group, dilations)
    # The full transposed convolution, then crop (or extend) each side, then the bias.
    y = _CONV_T[n](x, w, None, strides, 0, 0, group, dilations)
    index = [slice(None), slice(None)]
    grow = []
    for (b, e), op, f in zip(pads, out_pad, full):
        end = f + op - e
        index.append(slice(max(b, 0), min(end, f)))
        grow.append((max(-b, 0), max(end - f, 0)))
    y = y[tuple(index)]
    y = _explicit_pad(y, grow, 0.0)
    if bias is not None:
        y = y + bias.reshape([-1] + [1] * n)
    return y


def batch_norm(ctx: NodeContext):
    if ctx.attr("training_mode", 0) or any(ctx.output_used(i) for i in (1, 2, 3, 4)):
        raise ctx.refuse("training_mode", ctx.attr("training_mode", 0), "only inference BatchNormalization is supported")
    if len(ctx.shape(0)) < 2:
        raise ctx.error("BatchNormalization needs an input of rank >= 2")
    return F.batch_norm(ctx.tensor(0), ctx.tensor(3), ctx.tensor(4), ctx.tensor(1), ctx.tensor(2),
                        False, 0.0, ctx.attr("epsilon", 1e-5))


def gemm(ctx: NodeContext):
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    trans_a, trans_b = ctx.attr("transA", 0), ctx.attr("transB", 0)
    a = ctx.tensor(0)
    if trans_a:
        a = a.t()
    if ctx.is_const(1):
        b = ctx.const(1)
        weight = b if trans_b else b.T  # F.linear wants [N, K]
        if alpha != 1.0:
            weight = weight * np.asarray(alpha, dtype=weight.dtype)
        bias = None
        if ctx.has_input(2) and ctx.is_const(2):
            c = ctx.const(2)
            if beta != 1.0:
                c = c * np.asarray(beta, dtype=c.dtype)
            if c.ndim <= 1:
                bias = ctx.constant(np.broadcast_to(c, (weight.shape[0],)), "bias")
        y = torch.nn.functional.linear(a, ctx.constant(weight, "weight"), bias)
        if bias is None and ctx.has_input(2):
            y = y + (ctx.constant(c, "c") if ctx.is_const(2) else ctx.tensor(2) * beta)
        return y
    b = ctx.tensor(1)
    y = torch.matmul(a, b.t() if trans_b else b)
    if alpha != 1.0:
        y = y * alpha
    if ctx.has_input(2):
        c = ctx.tensor(2)
        y = y + (c * beta if beta != 1.0 else c)
    return y


def matmul(ctx: NodeContext):
    return torch.matmul(ctx.tensor(0), ctx.tensor(1))


def _pool_setup(ctx: NodeContext):
    in_shape = ctx.shape(0)
    n = _spatial(ctx, len(in_shape))
    kernel = ctx.attr("kernel_shape")
    if kernel is None or len(kernel) != n:
        raise ctx.refuse("kernel_shape", kernel, f"expected {n} values")
    kernel = list(kernel)
    strides, dilations = _ints(ctx, "strides", n, 1), _ints(ctx, "dilations", n, 1)
    pads = window_pads(ctx, in_shape[2:], kernel, strides, dilations)
    ceil_mode = bool(ctx.attr("ceil_mode", 0)) and ctx.attr("auto_pad", "NOTSET") in ("NOTSET", "VALID")
    out = []
    for size, k, s, d, (b, e) in zip(in_shape[2:], kernel, strides, dilations, pads):
        span = size + b + e - ((k - 1) * d + 1)
        if span < 0:
            raise ctx.error(f"kernel {kernel} (dilations {dilations}) is larger than the padded input {in_shape}")
        o = (math.ceil(span / s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= size + b:
            o -= 1  # the last window would start inside the end padding
        out.append(o)
    return n, kernel, strides, dilations, pads, ceil_mode, out


def _native_pads(kernel, dilations, pads) -> bool:
    return all(b == e and b <= ((k - 1) * d + 1) // 2 for k, d, (b, e) in zip(kernel, dilations, pads))


def _pad_to_windows(x, size, kernel, strides, dilations, pads, out, value):
    """Pad explicitly so that a floor-mode pool without padding gives exactly ``out`` windows."""
    grown = []
    for i, k, s, d, (b, e), o in zip(size, kernel, strides, dilations, pads, out):
        need = (o - 1) * s + (k - 1) * d + 1
        grown.append((b, max(need - i - b, 0)))
    return _explicit_pad(x, grown, value), grown


def max_pool(ctx: NodeContext):
    if ctx.output_used(1):
        raise ctx.error("the Indices output of MaxPool is not supported")
    if ctx.attr("storage_order", 0):
        raise ctx.refuse("storage_order", ctx.attr("storage_order"), "only row-major (0) is supported")
    n, kernel, strides, dilations, pads, ceil_mode, out = _pool_setup(ctx)
    x = ctx.tensor(0)
    if _native_pads(kernel, dilations, pads):
        return _MAX_POOL[n](x, kernel, strides, [b for b, _ in pads], dilations, ceil_mode)
    dtype = ctx.dtype(0)
    low = float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min
    x, _ = _pad_to_windows(x, ctx.shape(0)[2:], kernel, strides, dilations, pads, out, low)
    y = _MAX_POOL[n](x, kernel, strides, 0, dilations, False)
    return y[(slice(None), slice(None)) + tuple(slice(0, o) for o in out)]


def average_pool(ctx: NodeContext):
    n, kernel, strides, dilations, pads, ceil_mode, out = _pool_setup(ctx)
    if any(d != 1 for d in dilations):
        raise ctx.refuse("dilations", dilations, "AveragePool with dilation is not supported")
    include_pad = bool(ctx.attr("count_include_pad", 0))
    x = ctx.tensor(0)
    symmetric = _native_pads(kernel, dilations, pads)
    if symmetric and not ceil_mode:
        return _AVG_POOL[n](x, kernel, strides, [b for b, _ in pads], False, include_pad)
    # Sum over explicit zero padding, divided by the count ONNX uses for each window.
    size = ctx.shape(0)[2:]
    x, grown = _pad_to_windows(x, size, kernel, strides, dilations, pads, out, 0.0)
    summed = _AVG_POOL[n](x, kernel, strides, 0, False, True) * float(np.prod(kernel))
    summed = summed[(slice(None), slice(None)) + tuple(slice(0, o) for o in out)]
    counts = np.ones((), dtype=np.float64)
    for i, k, s, (b, e), o in zip(size, kernel, strides, pads, out):
        starts = np.arange(o) * s - b
        lo, hi = (-b, i + e) if include_pad else (0, i)
        count = np.minimum(starts + k, hi) - np.maximum(starts, lo)
        counts = np.multiply.outer(counts, count)
    return summed / ctx.constant(counts.astype(np.float32), "count")


def global_average_pool(ctx: NodeContext):
    dims = list(range(2, len(ctx.shape(0))))
    return torch.mean(ctx.tensor(0), dims, keepdim=True)


def global_max_pool(ctx: NodeContext):
    dims = list(range(2, len(ctx.shape(0))))
    return torch.amax(ctx.tensor(0), dims, keepdim=True)


def layer_norm(ctx: NodeContext):
    if ctx.output_used(1) or ctx.output_used(2):
        raise ctx.error("the Mean and InvStdDev outputs of LayerNormalization are not supported")
    shape = ctx.shape(0)
    axis = normalize_axis(ctx, ctx.attr("axis", -1), len(shape))
    normalized = shape[axis:]
    eps = ctx.attr("epsilon", 1e-5)
    x = ctx.tensor(0)
    if ctx.attr("stash_type", 1) != 1:
        raise ctx.refuse("stash_type", ctx.attr("stash_type"), "only float32 statistics (1) are supported")
    fits = [ctx.has_input(i) and ctx.shape(i) == tuple(normalized) for i in (1, 2)]
    weight = ctx.tensor(1) if fits[0] else None
    bias = ctx.tensor(2) if fits[1] else None
    y = F.layer_norm(x, normalized, weight, bias, eps)
    if not fits[0]:
        y = y * ctx.tensor(1)
    if ctx.has_input(2) and not fits[1]:
        y = y + ctx.tensor(2)
    return y


OPS = {
    "Conv": conv,
    "ConvTranspose": conv_transpose,
    "BatchNormalization": batch_norm,
    "Gemm": gemm,
    "MatMul": matmul,
    "MaxPool": max_pool,
    "AveragePool": average_pool,
    "GlobalAveragePool": global_average_pool,
    "GlobalMaxPool": global_max_pool,
    "LayerNormalization": layer_norm,
}
