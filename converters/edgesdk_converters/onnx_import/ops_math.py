"""Element-wise arithmetic, activations, comparisons, reductions, Softmax, ArgMax and TopK."""

from __future__ import annotations

import operator

import numpy as np
import torch
import torch.nn.functional as F

from .context import NodeContext, normalize_axis, scalar_or_tensor


def _operands(ctx: NodeContext):
    """Both inputs; a constant single-element side as a Python number (no extra buffer)."""
    return scalar_or_tensor(ctx, 0, len(ctx.shape(1))), scalar_or_tensor(ctx, 1, len(ctx.shape(0)))


def _binary(fn):
    def convert(ctx: NodeContext):
        a, b = _operands(ctx)
        return fn(a, b)
    return convert


def div(ctx: NodeContext):
    a, b = _operands(ctx)
    if ctx.dtype(0).is_floating_point:
        return a / b
    if not isinstance(a, torch.fx.Proxy):
        a = ctx.tensor(0)
    return torch.div(a, b, rounding_mode="trunc")


def pow_(ctx: NodeContext):
    """The result has the base's dtype, as in ONNX (torch would promote an integer base to float)."""
    base = ctx.tensor(0)
    rank = len(ctx.shape(0))
    exponent = scalar_or_tensor(ctx, 1, rank)
    if isinstance(exponent, torch.fx.Proxy):
        if ctx.dtype(1) != ctx.dtype(0):
            exponent = exponent.to(ctx.dtype(0))
    elif ctx.dtype(0).is_floating_point:
        exponent = float(exponent)
        if exponent == 2.0:
            return base * base  # exact, and a plain MUL in TFLite
    elif float(exponent).is_integer() and exponent >= 0:
        return _integer_power(base, int(exponent))
    else:
        # ONNX Runtime computes std::pow in double and truncates back to the base's type. float32 here, as
        # LiteRT has no float64 POW: the same unless |base| > 2**24 or a result lies within float32 rounding
        # below an integer.
        return torch.pow(base.to(torch.float32), float(exponent)).to(ctx.dtype(0))
    return torch.pow(base, exponent)


def _integer_power(base, exponent: int):
    """``base ** exponent`` for an integer tensor by squaring and multiplying: exact, and plain MULs in
    TFLite (litert-torch lowers an integer torch.pow through a float64 POW that TFLite does not have)."""
    result, square = None, base
    while exponent:
        if exponent & 1:
            result = square if result is None else result * square
        exponent >>= 1
        if exponent:
            square = square * square
    return torch.ones_like(base) if result is None else result


def _unary(fn):
    def convert(ctx: NodeContext):
        return fn(ctx.tensor(0))
    return convert


def clip(ctx: NodeContext):
    x = ctx.tensor(0)
    if ctx.opset < 11:
        low, high = ctx.attr("min"), ctx.attr("max")
    else:
        rank = len(ctx.shape(0))
        low = scalar_or_tensor(ctx, 1, rank) if ctx.has_input(1) else None
        high = scalar_or_tensor(ctx, 2, rank) if ctx.has_input(2) else None
    if low is None and high is None:
        return x
    if isinstance(low, float) and isinstance(high, float) and (low, high) == (0.0, 6.0):
        return F.relu6(x)
    if isinstance(low, torch.fx.Proxy) or isinstance(high, torch.fx.Proxy):
        if low is not None:
            x = torch.maximum(x, low if isinstance(low, torch.fx.Proxy) else ctx.tensor(1))
        if high is not None:
            x = torch.minimum(x, high if isinstance(high, torch.fx.Proxy) else ctx.tensor(2))
        return x
    return torch.clamp(x, low, high)


def hard_sigmoid(ctx: NodeContext):
    alpha, beta = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    x = ctx.tensor(0)
    if abs(alpha - 1 / 6) < 1e-7 and beta == 0.5:
        return F.hardsigmoid(x)
    return torch.clamp(x * alpha + beta, 0.0, 1.0)


def leaky_relu(ctx: NodeContext):
    return F.leaky_relu(ctx.tensor(0), ctx.attr("alpha", 0.01))


def prelu(ctx: NodeContext):
    x = ctx.tensor(0)
    shape = ctx.shape(0)
    if ctx.is_const(1) and len(shape) >= 2:
        slope = ctx.const(1)
        channel = shape[1]
        # The common ONNX layouts [C], [C, 1, 1] and [1] map onto F.prelu (a native PRELU in TFLite).
        squeezed = slope.reshape(-1)
        if slope.size in (1, channel) and (slope.size == 1 or slope.ndim == len(shape) - 1
                                            and slope.shape[0] == channel):
            return F.prelu(x, ctx.constant(squeezed, "slope"))
    slope = ctx.tensor(1)
    return torch.where(x < 0, x * slope, x)


def _softmax(fn):
    def convert(ctx: NodeContext):
        shape = ctx.shape(0)
        rank = len(shape)
        x = ctx.tensor(0)
        axis = normalize_axis(ctx, ctx.attr("axis", -1 if ctx.opset >= 13 else 1), rank)
        if ctx.opset >= 13 or axis == rank - 1:
            return fn(x, axis)
        # Before opset 13 the input is coerced to 2-D at `axis` and normalized over the second part.
        inner = int(np.prod(shape[axis:]))
        return fn(x.reshape(int(np.prod(shape[:axis])), inner), 1).reshape(shape)
    return convert


def _variadic(fn):
    def convert(ctx: NodeContext):
        values = [ctx.tensor(0)] + [scalar_or_tensor(ctx, i, len(ctx.shape(0))) for i in range(1, ctx.n_inputs)]
        result = values[0]
        for value in values[1:]:
            if not isinstance(value, torch.fx.Proxy):
                result = torch.clamp(result, min=value) if fn is torch.maximum else torch.clamp(result, max=value)
            else:
                result = fn(result, value)
        return result
    return convert


def where(ctx: NodeContext):
    rank = max(len(ctx.shape(i)) for i in range(3))
    a, b = scalar_or_tensor(ctx, 1, rank), scalar_or_tensor(ctx, 2, rank)
    if not isinstance(a, torch.fx.Proxy) and not isinstance(b, torch.fx.Proxy):
        a = ctx.tensor(1)
    return torch.where(ctx.tensor(0), a, b)


def _reduce_axes(ctx: NodeContext, axes_input_from: int):
    """The reduced axes (None: all) and keepdims; ``axes_input_from`` is the opset that moved axes to an input."""
    rank = len(ctx.shape(0))
    if ctx.opset >= axes_input_from:
        axes = [int(a) for a in ctx.const(1, "axes").reshape(-1)] if ctx.has_input(1) else []
    else:
        axes = list(ctx.attr("axes", []))
    keepdims = bool(ctx.attr("keepdims", 1))
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return "noop", keepdims
        return list(range(rank)), keepdims
    return sorted({normalize_axis(ctx, a, rank, "axes") for a in axes}), keepdims


def _reduce(fn, axes_input_from: int):
    def convert(ctx: NodeContext):
        axes, keepdims = _reduce_axes(ctx, axes_input_from)
        x = ctx.tensor(0)
        if axes == "noop":
            return x
        if not axes:  # a scalar input
            return x
        return fn(ctx, x, axes, keepdims)
    return convert


def _mean(ctx: NodeContext, x, axes, keepdims):
    if ctx.dtype(0).is_floating_point:
        return torch.mean(x, axes, keepdim=keepdims)
    # ONNX Runtime divides the integer sum by the count, truncating toward zero.
    count = int(np.prod([ctx.shape(0)[a] for a in axes]))
    if count == 0:
        raise ctx.error(f"the mean of zero {str(ctx.dtype(0)).removeprefix('torch.')} elements is undefined")
    total = torch.sum(x, axes, keepdim=keepdims, dtype=torch.int64)
    return torch.div(total, count, rounding_mode="trunc").to(ctx.dtype(0))


def _sum(ctx: NodeContext, x, axes, keepdims):
    return torch.sum(x, axes, keepdim=keepdims, dtype=ctx.dtype(0))  # torch would widen integers to int64


def _extreme(fn):
    return lambda ctx, x, axes, keepdims: fn(x, axes, keepdim=keepdims)


def argmax(ctx: NodeContext):
    shape = ctx.shape(0)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(shape))
    keepdims = bool(ctx.attr("keepdims", 1))
    x = ctx.tensor(0)
    if ctx.attr("select_last_index", 0):
        index = torch.argmax(torch.flip(x, [axis]), axis, keepdim=keepdims)
        return (shape[axis] - 1) - index
    return torch.argmax(x, axis, keepdim=keepdims)


def topk(ctx: NodeContext):
    shape = ctx.shape(0)
    axis = normalize_axis(ctx, ctx.attr("axis", -1), len(shape))
    if ctx.opset >= 10:
        if not ctx.is_const(1):
            raise ctx.refuse("K", ctx.node.input[1], "k must be a constant (it is computed at run time)")
        k = int(ctx.const(1, "K").reshape(-1)[0])
    else:
        k = ctx.attr("k")
    if not 0 <= k <= shape[axis]:
        raise ctx.refuse("K", k, f"the axis has {shape[axis]} elements")
    x = ctx.tensor(0)
    # One call in the graph, so the choice below is made when the module runs, not while importing.
    result = x.tracer.create_proxy("call_function", onnx_topk, (x, k, axis, bool(ctx.attr("largest", 1))), {})
    return [result[0], result[1]]


def onnx_topk(x: torch.Tensor, k: int, axis: int, largest: bool):
    """TopK with ONNX's order for equal values: lower index first.

    torch.topk leaves the order of ties unspecified (and does not follow the index on CPU), so eager
    runs a stable sort. litert-torch cannot lower a sort (its comparator gets int64 indices), so under
    torch.export this is torch.topk, which becomes TFLite's TOPK_V2: that kernel already puts ties in
    index order, for largest and smallest (the LiteRT tests check it against onnxruntime).
    """
    if torch.compiler.is_exporting():
        return torch.topk(x, k, axis, largest, True)
    values, indices = torch.sort(x, dim=axis, descending=largest, stable=True)
    return torch.narrow(values, axis, 0, k), torch.narrow(indices, axis, 0, k)


def _compare(fn):
    def convert(ctx: NodeContext):
        a, b = _operands(ctx)
        if not isinstance(a, torch.fx.Proxy):
            a = ctx.tensor(0)
        return fn(a, b)
    return convert


OPS = {
    "Add": _binary(operator.add),
    "Sub": _binary(operator.sub),
    "Mul": _binary(operator.mul),
    "Div": div,
    "Pow": pow_,
    "Sqrt": _unary(torch.sqrt),
    "Relu": _unary(F.relu),
    "Sigmoid": _unary(torch.sigmoid),
    "Tanh": _unary(torch.tanh),
    "Erf": _unary(torch.erf),
    "Neg": _unary(torch.neg),
    "Exp": _unary(torch.exp),
    "Log": _unary(torch.log),
    "Abs": _unary(torch.abs),
    "Not": _unary(torch.logical_not),
    "HardSwish": _unary(F.hardswish),
    "HardSigmoid": hard_sigmoid,
    "LeakyRelu": leaky_relu,
    "PRelu": prelu,
    "Clip": clip,
    "Softmax": _softmax(torch.softmax),
    "LogSoftmax": _softmax(torch.log_softmax),
    "Min": _variadic(torch.minimum),
    "Max": _variadic(torch.maximum),
    "Where": where,
    "Equal": _compare(torch.eq),
    "Less": _compare(torch.lt),
    "LessOrEqual": _compare(torch.le),
    "Greater": _compare(torch.gt),
    "GreaterOrEqual": _compare(torch.ge),
    "ReduceMean": _reduce(_mean, 18),
    "ReduceSum": _reduce(_sum, 13),
    "ReduceMax": _reduce(_extreme(torch.amax), 18),
    "ReduceMin": _reduce(_extreme(torch.amin), 18),
    "ArgMax": argmax,
    "TopK": topk,
}
