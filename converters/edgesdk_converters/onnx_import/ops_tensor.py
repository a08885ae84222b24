"""Layout and indexing: reshapes, transposes, concatenation, splitting, slicing, gathering, padding, casts.

Every shape argument is a constant by the time a converter runs (the importer folds shape
arithmetic), so each op becomes one static torch call.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .context import NodeContext, normalize_axis, torch_dtype


def flatten(ctx: NodeContext):
    shape = ctx.shape(0)
    axis = ctx.attr("axis", 1)
    if not -len(shape) <= axis <= len(shape):
        raise ctx.refuse("axis", axis, f"out of range for a rank-{len(shape)} input")
    axis = axis + len(shape) if axis < 0 else axis
    return ctx.tensor(0).reshape(int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))


def reshape(ctx: NodeContext):
    shape = ctx.shape(0)
    target = [int(d) for d in ctx.const(1, "shape").reshape(-1)]
    allow_zero = ctx.attr("allowzero", 0)
    if not allow_zero:
        for i, d in enumerate(target):
            if d == 0:
                if i >= len(shape):
                    raise ctx.error(f"shape {target} copies dim {i} (0), which the rank-{len(shape)} input lacks")
                target[i] = shape[i]
    if target.count(-1) > 1:
        raise ctx.error(f"shape {target} has more than one -1")
    size = int(np.prod(shape))
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1]))
        if known == 0 or size % known:
            raise ctx.error(f"cannot reshape {list(shape)} to {target}")
        target[target.index(-1)] = size // known
    if int(np.prod(target)) != size:
        raise ctx.error(f"cannot reshape {list(shape)} to {target}")
    return ctx.tensor(0).reshape(target)


def transpose(ctx: NodeContext):
    rank = len(ctx.shape(0))
    perm = ctx.attr("perm", list(range(rank))[::-1])
    if sorted(perm) != list(range(rank)):
        raise ctx.refuse("perm", perm, f"not a permutation of the {rank} dims")
    return ctx.tensor(0).permute(*perm)


def _axes(ctx: NodeContext, input_from: int = 13):
    if ctx.opset >= input_from:
        return [int(a) for a in ctx.const(1, "axes").reshape(-1)] if ctx.has_input(1) else None
    axes = ctx.attr("axes")
    return list(axes) if axes is not None else None


def squeeze(ctx: NodeContext):
    shape = ctx.shape(0)
    axes = _axes(ctx)
    if axes is None:
        keep = [d for d in shape if d != 1]
    else:
        axes = {normalize_axis(ctx, a, len(shape), "axes") for a in axes}
        bad = [a for a in axes if shape[a] != 1]
        if bad:
            raise ctx.error(f"axes {sorted(bad)} of shape {list(shape)} are not 1 and cannot be squeezed")
        keep = [d for i, d in enumerate(shape) if i not in axes]
    return ctx.tensor(0).reshape(keep)


def unsqueeze(ctx: NodeContext):
    shape = list(ctx.shape(0))
    axes = _axes(ctx)
    if axes is None:
        raise ctx.error("axes are required")
    rank = len(shape) + len(axes)
    for a in sorted(normalize_axis(ctx, a, rank, "axes") for a in axes):
        shape.insert(a, 1)
    return ctx.tensor(0).reshape(shape)


def concat(ctx: NodeContext):
    rank = len(ctx.shape(0))
    if ctx.attr("axis") is None:
        raise ctx.error("the axis attribute is required")
    axis = normalize_axis(ctx, ctx.attr("axis"), rank)
    parts = [ctx.tensor(i) for i in range(ctx.n_inputs) if ctx.has_input(i) and ctx.shape(i)[axis:axis + 1] != (0,)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, axis)


def split(ctx: NodeContext):
    shape = ctx.shape(0)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(shape))
    count = len(ctx.node.output)
    if ctx.opset >= 13:
        sizes = [int(s) for s in ctx.const(1, "split").reshape(-1)] if ctx.has_input(1) else None
    else:
        sizes = ctx.attr("split")
    if sizes is None:
        parts = ctx.attr("num_outputs", count)
        chunk = -(-shape[axis] // parts)
        sizes = [min(chunk, shape[axis] - i * chunk) for i in range(parts)]
    sizes = list(sizes)
    if sum(sizes) != shape[axis] or len(sizes) != count or min(sizes) < 0:
        raise ctx.refuse("split", sizes, f"must give {count} sizes adding up to {shape[axis]} (axis {axis})")
    pieces = torch.split(ctx.tensor(0), sizes, axis)
    return [pieces[i] for i in range(count)]


def slice_(ctx: NodeContext):
    shape = ctx.shape(0)
    rank = len(shape)
    if ctx.opset >= 10:
        starts = ctx.const(1, "starts").reshape(-1).tolist()
        ends = ctx.const(2, "ends").reshape(-1).tolist()
        axes = ctx.const(3, "axes").reshape(-1).tolist() if ctx.has_input(3) else list(range(len(starts)))
        steps = ctx.const(4, "steps").reshape(-1).tolist() if ctx.has_input(4) else [1] * len(starts)
    else:
        starts, ends = list(ctx.attr("starts")), list(ctx.attr("ends"))
        axes = list(ctx.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length")
    x = ctx.tensor(0)
    flips, index = [], [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = normalize_axis(ctx, int(axis), rank, "axes")
        if step == 0:
            raise ctx.refuse("steps", steps, "a step of 0")
        picked = range(*slice(int(start), int(end), int(step)).indices(shape[axis]))
        if step < 0 and len(picked):
            # torch slices only forwards: flip the axis and take the mirrored positions.
            flips.append(axis)
            size = shape[axis]
            picked = range(size - 1 - picked[0], size - 1 - picked[-1] + 1, -step)
        index[axis] = slice(picked.start, picked.stop, picked.step) if len(picked) else slice(0, 0)
    if flips:
        x = torch.flip(x, flips)
    return x[tuple(index)]


def gather(ctx: NodeContext):
    shape = ctx.shape(0)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(shape))
    data = ctx.tensor(0)
    if ctx.is_const(1):
        indices = ctx.const(1).astype(np.int64)
        if indices.size and (indices.min() < -shape[axis] or indices.max() >= shape[axis]):
            raise ctx.error(f"indices {indices.tolist()} are out of range for axis {axis} of size {shape[axis]}")
        indices = np.where(indices < 0, indices + shape[axis], indices)
        if indices.ndim == 0:
            return data.select(axis, int(indices))
        index_shape = list(indices.shape)
        flat = ctx.constant(indices.reshape(-1), "indices")
    else:
        index_shape = list(ctx.shape(1))
        runtime = ctx.tensor(1).to(torch.int64)
        flat = torch.where(runtime < 0, runtime + shape[axis], runtime).reshape(-1)
    picked = torch.index_select(data, axis, flat)
    return picked.reshape(list(shape[:axis]) + index_shape + list(shape[axis + 1:]))


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}


def pad(ctx: NodeContext):
    shape = ctx.shape(0)
    rank = len(shape)
    mode = ctx.attr("mode", "constant")
    if mode not in _PAD_MODES:
        raise ctx.refuse("mode", mode, "supported modes: constant, reflect, edge")
    if ctx.opset >= 11:
        pads = [int(p) for p in ctx.const(1, "pads").reshape(-1)]
        value = ctx.const(2, "constant_value").reshape(-1) if ctx.has_input(2) else np.zeros(1)
        value = value[0].item() if value.size else 0
        axes = [int(a) for a in ctx.const(3, "axes").reshape(-1)] if ctx.has_input(3) else list(range(rank))
    else:
        pads, value, axes = list(ctx.attr("pads")), ctx.attr("value", 0.0), list(range(rank))
    if len(pads) != 2 * len(axes):
        raise ctx.refuse("pads", pads, f"expected {2 * len(axes)} values")
    begin, end = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        a = normalize_axis(ctx, a, rank, "axes")
        begin[a], end[a] = pads[i], pads[i + len(axes)]
    x = ctx.tensor(0)
    # Negative pads crop; do that first with a slice, then pad with what is left.
    if min(begin + end) < 0:
        x = x[tuple(slice(max(-b, 0), shape[i] - max(-e, 0)) for i, (b, e) in enumerate(zip(begin, end)))]
        shape = tuple(shape[i] - max(-b, 0) - max(-e, 0) for i, (b, e) in enumerate(zip(begin, end)))
        begin, end = [max(b, 0) for b in begin], [max(e, 0) for e in end]
    padded = [i for i in range(rank) if begin[i] or end[i]]
    if not padded:
        return x
    if mode == "constant":
        flat = [p for i in reversed(range(rank)) for p in (begin[i], end[i])]
        return F.pad(x, flat, "constant", value)
    first = padded[0]
    trailing = rank - first
    if trailing > 3:
        raise ctx.refuse("mode", mode, f"{mode} padding reaches {trailing} trailing dims; at most 3 are supported")
    for i in padded:
        if mode == "reflect" and (begin[i] >= shape[i] or end[i] >= shape[i]):
            raise ctx.refuse("pads", pads, f"reflect padding must be smaller than the padded dim ({shape[i]})")
    # torch pads the trailing 1-3 dims of a (N, C, ...) tensor: fold the leading dims into C.
    folded = x.reshape([1, int(np.prod(shape[:first]))] + list(shape[first:]))
    flat = [p for i in reversed(range(first, rank)) for p in (begin[i], end[i])]
    y = F.pad(folded, flat, _PAD_MODES[mode])
    return y.reshape(list(shape[:first]) + [shape[i] + begin[i] + end[i] for i in range(first, rank)])


def cast(ctx: NodeContext):
    return ctx.tensor(0).to(torch_dtype(ctx.attr("to"), f"node {ctx.name!r} (Cast) attribute 'to'"))


def identity(ctx: NodeContext):
    return ctx.tensor(0)


def dropout(ctx: NodeContext):
    training = ctx.is_const(2) and bool(ctx.const(2).reshape(-1)[0]) if ctx.has_input(2) else False
    if training or (ctx.has_input(2) and not ctx.is_const(2)):
        raise ctx.refuse("training_mode", ctx.node.input[2], "only inference Dropout is supported")
    if ctx.output_used(1):
        raise ctx.error("the mask output of Dropout is not supported")
    return ctx.tensor(0)


def expand(ctx: NodeContext):
    target = [int(d) for d in ctx.const(1, "shape").reshape(-1)]
    try:
        out = np.broadcast_shapes(ctx.shape(0), tuple(target))
    except ValueError:
        raise ctx.error(f"shape {list(ctx.shape(0))} cannot be broadcast to {target}") from None
    return ctx.tensor(0).expand(*out)


def folded_only(ctx: NodeContext):
    """Constant, Shape, Size and ConstantOfShape are evaluated at import time; reaching here means a run-time shape."""
    ctx.const(0, "shape")
    raise ctx.error("expected to be folded to a constant at import time")


def cast_like(ctx: NodeContext):
    return ctx.tensor(0).to(ctx.dtype(1))


OPS = {
    "Flatten": flatten,
    "Reshape": reshape,
    "Transpose": transpose,
    "Squeeze": squeeze,
    "Unsqueeze": unsqueeze,
    "Concat": concat,
    "Split": split,
    "Slice": slice_,
    "Gather": gather,
    "Pad": pad,
    "Cast": cast,
    "CastLike": cast_like,
    "Identity": identity,
    "Dropout": dropout,
    "Expand": expand,
    "ConstantOfShape": folded_only,
    "Constant": folded_only,
    "Shape": folded_only,
}
