"""Which task a quantize run records: the one asked for, made to fit the source's outputs, or the default.

``quantize(task=...)`` takes a :class:`~edgesdk.tasks.TaskSpec`, its table or a type's name; without one, a source
with one 2-D float output is a classifier and anything else ``raw``. The roles must name the source's outputs (a
one-output model, or one with exactly as many outputs as the task has roles, needs none). A text task without a
charset takes the one a PaddleOCR export carries in its ONNX metadata (``character``, one per line), with the space
PaddleOCR appends when the classes leave room for it. Every problem is a :class:`ConversionError` raised before any
conversion starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgesdk.errors import ConversionError, InputError
from edgesdk.tasks import TaskSpec, TaskType, default_task

MAX_CHARSET_FILE_BYTES = 4 << 20


def choose_task(task: TaskSpec | None, src: Any) -> TaskSpec:
    """The resolved task for ``src`` (its ``outputs``: name, shape, dtype)."""
    outputs = [s.to_dict() for s in src.outputs]
    names = [o["name"] for o in outputs]
    spec = task if task is not None else default_task(outputs)
    if spec.type is TaskType.TEXT and spec.params.get("charset") is None:
        charset = _metadata_charset(src, spec, outputs)
        if charset is not None:
            spec = TaskSpec.from_dict({**spec.to_dict(), "charset": charset})
    try:
        return spec.resolved(names)
    except InputError as exc:
        raise ConversionError(f"task {spec.type} does not fit {src.name}: {exc}") from exc


def read_charset(path: str | Path) -> list[str]:
    """A charset file: one character (or token) per line, in class order after the blank; a line holding only a
    space is the space character."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"charset file not found: {path}")
    if path.stat().st_size > MAX_CHARSET_FILE_BYTES:
        raise ConversionError(f"charset file {path} is over {MAX_CHARSET_FILE_BYTES} bytes")
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    chars = [line.rstrip("\r") for line in lines]
    empty = [i + 1 for i, c in enumerate(chars) if not c]
    if empty or not chars:
        raise ConversionError(f"charset file {path}: line(s) {empty[:5] or [1]} are empty; one character per line")
    return chars


def _metadata_charset(src: Any, spec: TaskSpec, outputs: list[dict]) -> list[str] | None:
    if getattr(src, "kind", None) != "onnx" or src.path is None:
        return None
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(src.path), load_external_data=False).metadata_props}
    if "character" not in meta:
        return None
    chars = [c for c in meta["character"].split("\n") if c]
    index = spec.output_index("logits", [o["name"] for o in outputs])
    shape = outputs[index if index is not None else 0]["shape"]
    classes = shape[-1] if shape else -1
    if classes == len(chars) + 2:  # blank + characters + the space PaddleOCR appends (use_space_char)
        chars.append(" ")
    return chars
