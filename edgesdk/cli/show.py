"""How ``edgesdk run`` shows a task's answer: one line of text per input (:func:`describe`), and with ``--draw`` the
input image with the boxes, masks, points or text drawn on it for a person to look at (:func:`draw`, Pillow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..tasks.results import Decoded

MAX_LISTED = 5  # detections or masks named on the one line; --json has them all
_COLOURS = [(230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48), (145, 30, 180), (70, 240, 240),
            (240, 50, 230), (210, 245, 60)]


def describe(decoded: Decoded) -> str | None:
    """One line saying what a task's answer is (None for classification and raw: shown as before)."""
    if decoded.detections is not None:
        dets = decoded.detections
        shown = "; ".join(f"{_name(d.label, d.class_index)} {d.score:.2f} at "
                          f"[{', '.join(f'{v:.0f}' for v in d.box)}]" for d in dets[:MAX_LISTED])
        more = f"; +{len(dets) - MAX_LISTED} more" if len(dets) > MAX_LISTED else ""
        return f"{len(dets)} detection(s){': ' + shown if dets else ''}{more}"
    if decoded.masks is not None:
        masks = decoded.masks
        shown = "; ".join(f"{_name(m.label, m.class_index)} {m.area} px" for m in masks[:MAX_LISTED])
        return f"{len(masks)} mask(s){': ' + shown if masks else ''}"
    if decoded.text is not None:
        return f"text {decoded.text.text!r} (confidence {decoded.text.confidence:.3f}, lowest character " \
               f"{min(decoded.text.char_confidences, default=0.0):.3f})"
    if decoded.landmarks is not None:
        pts = decoded.landmarks.points
        presence = "" if decoded.landmarks.presence is None else f", presence {decoded.landmarks.presence:.3f}"
        return f"{len(pts)} point(s), x {pts[:, 0].min():.1f}..{pts[:, 0].max():.1f}, " \
               f"y {pts[:, 1].min():.1f}..{pts[:, 1].max():.1f}{presence}"
    if decoded.embedding is not None:
        e = decoded.embedding
        return f"embedding of {e.size} values, norm {float(np.linalg.norm(e)):.4f}"
    if decoded.values is not None and decoded.task in ("regression", "probability"):
        v = np.asarray(decoded.values).reshape(-1)
        head = ", ".join(f"{x:.4g}" for x in v[:6])
        return f"{decoded.task} {head}{' ...' if v.size > 6 else ''}"
    return None


def _name(label: str | None, index: int) -> str:
    return label if label is not None else f"class {index}"


def draw(decoded: Decoded, image: Any, out: Path) -> Path:
    """Draw ``decoded`` on ``image`` (a path or a uint8 array, the original the coordinates are in) and write a PNG
    at ``out``. A model given arrays, not images, has nothing to draw on: an :class:`InputError`."""
    from PIL import Image, ImageDraw

    if isinstance(image, (str, Path)):
        with Image.open(image) as opened:
            canvas = opened.convert("RGB")
    elif isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim in (2, 3):
        canvas = Image.fromarray(image).convert("RGB")
    else:
        raise InputError("--draw needs an image input (the results are drawn on it); this input is an array")
    if decoded.masks:
        overlay = np.asarray(canvas, dtype=np.float32)
        for m in decoded.masks:
            if m.mask.shape != overlay.shape[:2]:
                continue
            colour = np.array(_COLOURS[m.class_index % len(_COLOURS)], np.float32)
            overlay[m.mask] = 0.5 * overlay[m.mask] + 0.5 * colour
        canvas = Image.fromarray(overlay.astype(np.uint8))
    pen = ImageDraw.Draw(canvas)
    width = max(1, round(max(canvas.size) / 200))
    for d in decoded.detections or []:
        colour = _COLOURS[d.class_index % len(_COLOURS)]
        pen.rectangle([float(v) for v in d.box], outline=colour, width=width)
        pen.text((d.box[0] + 2, max(0.0, d.box[1] - 11)), f"{_name(d.label, d.class_index)} {d.score:.2f}",
                 fill=colour)
        for x, y in d.keypoints or ():
            pen.ellipse([x - width, y - width, x + width, y + width], fill=colour)
    if decoded.landmarks is not None:
        r = max(1, width)
        for x, y in decoded.landmarks.points[:, :2]:
            pen.ellipse([x - r, y - r, x + r, y + r], fill=(0, 255, 0))
    if decoded.text is not None:
        pen.text((2, 2), decoded.text.text, fill=(255, 0, 0))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out, format="PNG")
    return out


def drawn_path(out: Path, source: str, several: bool) -> Path:
    """Where ``--draw OUT`` writes the drawing of input ``source``: OUT itself for one input; for several, OUT is a
    directory and each drawing is ``<input stem>.drawn.png`` in it."""
    if not several:
        return out
    return out / f"{Path(source.split('[')[0]).stem}.drawn.png"
