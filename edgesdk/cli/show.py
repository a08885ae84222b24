"""How ``edgesdk run`` shows a task's answer: one line of text per input (:func:`describe`), and with ``--draw`` the
input image with the boxes, masks, points or text drawn on it for a person to look at (:func:`render`, Pillow),
written where :class:`Drawings` says: a name of its own per input, never over an existing file or through a link
unless ``--force`` (then the link itself is replaced, never what it points to)."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from ..choices import TaskType
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
    if decoded.values is not None and decoded.task in (TaskType.REGRESSION, TaskType.PROBABILITY):
        v = np.asarray(decoded.values).reshape(-1)
        head = ", ".join(f"{x:.4g}" for x in v[:6])
        return f"{decoded.task} {head}{' ...' if v.size > 6 else ''}"
    return None


def _name(label: str | None, index: int) -> str:
    return label if label is not None else f"class {index}"


def draw(decoded: Decoded, image: Any, out: Path) -> Path:
    """Draw ``decoded`` on ``image`` (a path or a uint8 array, the original the coordinates are in) and write a PNG
    at ``out`` (replaced if it exists: the demo's own folder). A model given arrays, not images, has nothing to draw
    on: an :class:`InputError`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    render(decoded, image).save(out, format="PNG")
    return out


def render(decoded: Decoded, image: Any) -> Any:
    """``decoded`` drawn on ``image`` (a path or a uint8 array, the original the coordinates are in): a PIL image.
    A model given arrays, not images, has nothing to draw on: an :class:`InputError`."""
    from PIL import Image, ImageDraw

    if isinstance(image, (str, Path)):
        from ..bundle.tensors import RegularFile  # the file predicted may have been swapped for a FIFO since

        with RegularFile(Path(image), "image") as file, Image.open(file) as opened:
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
    return canvas


class Drawings:
    """The files of ``--draw OUT``: OUT itself for one input; for several inputs, or when OUT is a directory, one
    ``<input stem>.drawn.png`` per input in the directory OUT (made if missing), a sample of a file named
    ``<stem>.<i>.drawn.png``, and ``-2``, ``-3``... added to a name already given in this run (a/x.png and b/x.png).

    A file that exists is refused unless ``force``; then a regular file or a symlink is replaced by the new file
    (renamed over it: a link is replaced, never written through), anything else (a device, a directory) is
    refused. Any failure is an :class:`InputError` for that input; the others are still drawn."""

    def __init__(self, out: Path, several: bool, force: bool):
        self.out, self.force = Path(out), force
        self.folder = several or self.out.is_dir()
        self._given: set[str] = set()

    def write(self, label: str, decoded: Decoded, image: Any) -> Path:
        """Draw ``decoded`` on ``image`` and write it for input ``label``; returns the PNG written."""
        png = io.BytesIO()
        try:
            render(decoded, image).save(png, format="PNG")
        except (OSError, ValueError, SyntaxError, EOFError) as exc:  # Pillow's, on a file changed since predict
            raise InputError(f"{label} cannot be drawn: {type(exc).__name__}: {exc}") from exc
        path = self._path(label)
        if self.folder and (self.out.exists() or self.out.is_symlink()) and not self.out.is_dir():
            raise InputError(f"{self.out} is not a directory; with several inputs, --draw OUT is the directory of "
                             "their drawings")
        try:
            if self.folder:
                self.out.mkdir(parents=True, exist_ok=True)
            (_replace if self.force else _create)(path, png.getvalue())
        except FileExistsError:
            raise InputError(f"{path} exists; --force replaces it") from None
        except OSError as exc:
            raise InputError(f"{path} cannot be written: {exc.strerror or exc}") from exc
        return path

    def _path(self, label: str) -> Path:
        if not self.folder:
            return self.out
        source, _, sample = label.partition("[")
        stem = Path(source).stem + (f".{sample.rstrip(']')}" if sample else "")
        name, n = f"{stem}.drawn.png", 1
        while name in self._given:
            n += 1
            name = f"{stem}-{n}.drawn.png"
        self._given.add(name)
        return self.out / name


def _create(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file ``path``: an existing file or link (even a dangling one) is FileExistsError."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        path.unlink(missing_ok=True)  # ours (O_EXCL made it): no half drawing left behind
        raise


def _replace(path: Path, data: bytes) -> None:
    """Put a new file with ``data`` at ``path`` in one rename: a regular file or a link there is replaced (the
    link itself), anything else refused."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise InputError(f"{path} exists and is not a regular file; it is not replaced")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    _create(tmp, data)
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
