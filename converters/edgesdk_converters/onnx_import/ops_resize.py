"""Resize and Upsample.

Source coordinates are computed here with numpy exactly as ONNX Runtime does (float32), for
every mode. When ``F.interpolate`` reproduces them (the usual nearest/bilinear cases) the op
becomes one interpolate call, which LiteRT runs as a native RESIZE op; otherwise each resized
axis becomes an ``index_select`` (nearest) or two of them blended with constant weights (linear).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .context import NodeContext, normalize_axis

_COORDINATE_MODES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "half_pixel_symmetric")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
_LINEAR_NAMES = {3: "linear", 4: "bilinear", 5: "trilinear"}
_f32 = np.float32


def _settings(ctx: NodeContext):
    """(mode, coordinate mode, nearest mode) with the defaults of this op and opset."""
    mode = ctx.attr("mode", "nearest")
    if mode == "bilinear":  # the name some Upsample exporters used
        mode = "linear"
    if mode not in ("nearest", "linear"):
        raise ctx.refuse("mode", mode, "supported modes: nearest, linear")
    if ctx.op == "Upsample" or ctx.opset < 11:
        return mode, "asymmetric", "simple"
    coordinate = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if coordinate not in _COORDINATE_MODES:
        raise ctx.refuse("coordinate_transformation_mode", coordinate, f"supported: {', '.join(_COORDINATE_MODES)}")
    nearest = ctx.attr("nearest_mode", "round_prefer_floor")
    if nearest not in _NEAREST_MODES[:4]:
        raise ctx.refuse("nearest_mode", nearest, f"supported: {', '.join(_NEAREST_MODES[:4])}")
    if ctx.attr("antialias", 0):
        raise ctx.refuse("antialias", ctx.attr("antialias"), "antialiased resizing is not supported")
    if ctx.attr("exclude_outside", 0) and mode != "nearest":
        raise ctx.refuse("exclude_outside", ctx.attr("exclude_outside"), "only for cubic mode, which is not supported")
    return mode, coordinate, nearest


def _sizes_and_scales(ctx: NodeContext, shape):
    """Output shape and the float32 scale ONNX uses per axis."""
    rank = len(shape)
    if ctx.op == "Upsample" and ctx.opset < 9:
        scales, sizes = np.asarray(ctx.attr("scales"), dtype=_f32), None
    elif ctx.op == "Upsample" or ctx.opset < 11:
        scales, sizes = ctx.const(1, "scales").astype(_f32).reshape(-1), None
    else:
        scales = ctx.const(2, "scales").astype(_f32).reshape(-1) if ctx.has_input(2) else None
        sizes = ctx.const(3, "sizes").astype(np.int64).reshape(-1) if ctx.has_input(3) else None
        if scales is not None and scales.size == 0:
            scales = None
        if sizes is not None and sizes.size == 0:
            sizes = None
    if (scales is None) == (sizes is None):
        raise ctx.error("exactly one of scales and sizes must be given")
    axes = ctx.attr("axes")
    axes = [normalize_axis(ctx, a, rank, "axes") for a in axes] if axes is not None else list(range(rank))
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        raise ctx.error(f"{'scales' if sizes is None else 'sizes'} has {len(given)} values for {len(axes)} axes")
    out, scale = list(shape), [_f32(1)] * rank
    if sizes is not None:
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            raise ctx.refuse("keep_aspect_ratio_policy", policy)
        ratios = [_f32(s) / _f32(shape[a]) for s, a in zip(sizes, axes)]
        if policy != "stretch":
            common = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [common] * len(axes)
            sizes = [int(np.floor(common * _f32(shape[a]) + _f32(0.5))) for a in axes]
        for a, s, r in zip(axes, sizes, ratios):
            out[a], scale[a] = int(s), _f32(r)
    else:
        for a, s in zip(axes, scales):
            if s <= 0:
                raise ctx.refuse("scales", scales.tolist(), "scales must be positive")
            out[a], scale[a] = int(_f32(shape[a]) * s), _f32(s)
    return out, scale


def _source_coords(coordinate: str, length_in: int, length_out: int, scale) -> np.ndarray:
    x = np.arange(length_out, dtype=_f32)
    half = _f32(0.5)
    if coordinate == "asymmetric":
        return x / scale
    if coordinate == "align_corners":
        if length_out == 1:
            return np.zeros(1, _f32)
        return x * _f32(length_in - 1) / _f32(length_out - 1)
    if coordinate == "pytorch_half_pixel" and length_out == 1:
        return np.zeros(1, _f32)
    if coordinate == "half_pixel_symmetric":
        adjustment = _f32(length_out) / (scale * _f32(length_in))
        offset = _f32(length_in) / _f32(2) * (_f32(1) - adjustment)
        return offset + (x + half) / scale - half
    return (x + half) / scale - half


def _nearest_index(nearest: str, coords: np.ndarray, length_in: int, downsampling: bool) -> np.ndarray:
    if nearest == "simple":
        index = np.ceil(coords) if downsampling else np.trunc(coords)
    elif nearest == "floor":
        index = np.floor(coords)
    elif nearest == "ceil":
        index = np.ceil(coords)
    elif nearest == "round_prefer_ceil":
        index = np.round(coords)
        index = np.where(coords == np.floor(coords) + _f32(0.5), np.ceil(coords), index)
    else:
        index = np.round(coords)
        index = np.where(coords == np.floor(coords) + _f32(0.5), np.floor(coords), index)
    return np.clip(index, 0, length_in - 1).astype(np.int64)


def _torch_nearest_exact(length_in: int, length_out: int) -> np.ndarray:
    """The source indices of F.interpolate(mode='nearest-exact') with an output size."""
    x = np.arange(length_out, dtype=_f32)
    if length_in == length_out:
        return x.astype(np.int64)
    scale = _f32(length_in) / _f32(length_out)
    return np.minimum(np.floor((x + _f32(0.5)) * scale), length_in - 1).astype(np.int64)


def _linear_weights(coords: np.ndarray, length_in: int):
    coords = np.clip(coords, 0, length_in - 1)
    low = np.minimum(np.floor(coords), length_in - 1).astype(np.int64)
    high = np.minimum(low + 1, length_in - 1)
    w_high = (coords - low).astype(_f32)
    w_low = (_f32(1) - w_high).astype(_f32)
    same = low == high
    w_low[same], w_high[same] = 0.5, 0.5
    return low, high, w_low, w_high


def resize(ctx: NodeContext):
    shape = ctx.shape(0)
    rank = len(shape)
    mode, coordinate, nearest = _settings(ctx)
    if mode == "linear" and not ctx.dtype(0).is_floating_point:
        # ONNX Runtime rounds integer blends its own way; nearest just picks elements and is exact for any dtype.
        raise ctx.error(f"linear resizing of {str(ctx.dtype(0)).removeprefix('torch.')} tensors is not supported "
                        "(only floating-point ones; nearest works for every dtype)")
    out, scale = _sizes_and_scales(ctx, shape)
    x = ctx.tensor(0)
    axes = [a for a in range(rank) if out[a] != shape[a] or scale[a] != 1]
    if not axes:
        return x
    plans = {}
    for a in axes:
        coords = _source_coords(coordinate, shape[a], out[a], scale[a])
        if mode == "nearest":
            plans[a] = _nearest_index(nearest, coords, shape[a], scale[a] < 1)
        else:
            plans[a] = _linear_weights(coords, shape[a])
    # torch's nearest interpolate kernels are float-only, so other dtypes take the index path.
    native = _native(mode, coordinate, shape, out, scale, plans) if ctx.dtype(0).is_floating_point else None
    if native is not None:
        return F.interpolate(x, size=out[2:], **native)
    for a in axes:
        broadcast = [-1] + [1] * (rank - a - 1)
        if _is_identity(mode, plans[a], shape[a]):
            continue
        if mode == "nearest":
            index = plans[a]
            x = torch.index_select(x, a, ctx.constant(index, f"index{a}"))
        else:
            low, high, w_low, w_high = plans[a]
            below = torch.index_select(x, a, ctx.constant(low, f"low{a}"))
            above = torch.index_select(x, a, ctx.constant(high, f"high{a}"))
            x = below * ctx.constant(w_low.reshape(broadcast), f"wlow{a}") + \
                above * ctx.constant(w_high.reshape(broadcast), f"whigh{a}")
    return x


def _is_identity(mode, plan, length: int) -> bool:
    """Whether the plan for an axis gives back every element where it was."""
    if mode == "nearest":
        return np.array_equal(plan, np.arange(length))
    low, high, _, w_high = plan
    return np.array_equal(low, np.arange(length)) and bool(np.all((w_high == 0) | (high == low)))


def _native(mode, coordinate, shape, out, scale, plans):
    """F.interpolate keyword arguments when it gives exactly ONNX's result, else None."""
    rank = len(shape)
    if rank not in _LINEAR_NAMES or out[0] != shape[0] or out[1] != shape[1]:
        return None
    # F.interpolate leaves batch and channels alone; a scale there can keep the size yet move elements.
    if any(a in plans and not _is_identity(mode, plans[a], shape[a]) for a in (0, 1)):
        return None
    spatial = range(2, rank)
    if mode == "nearest":
        # Only 'nearest-exact': litert-torch 0.10 lowers mode='nearest' with half-pixel centers too, which
        # differs from torch (and ONNX asymmetric/floor) unless the ratio is an integer upscale.
        if all(a not in plans or np.array_equal(plans[a], _torch_nearest_exact(shape[a], out[a])) for a in spatial):
            return {"mode": "nearest-exact"}
        return None
    if coordinate == "align_corners":
        return {"mode": _LINEAR_NAMES[rank], "align_corners": True}
    # torch's half-pixel source is (x + 0.5) * in / out - 0.5: the same when ONNX's scale is out / in.
    if coordinate not in ("half_pixel", "pytorch_half_pixel"):
        return None
    for a in spatial:
        if scale[a] != _f32(out[a]) / _f32(shape[a]):
            return None
        if coordinate == "pytorch_half_pixel" and out[a] == 1 and shape[a] > 1:
            return None
    return {"mode": _LINEAR_NAMES[rank], "align_corners": False}


OPS = {"Resize": resize, "Upsample": resize}
