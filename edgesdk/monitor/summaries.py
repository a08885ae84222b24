"""What the monitor keeps of one prediction instead of its input: a few numbers per input and per output.

The same code summarizes the calibration and validation data at quantize time (the bundle's reference) and every
prediction on the device, so the two are measured the same way.

Per input (:class:`InputSummary`), read from the model's prepared input tensor (after preprocessing):

- ``NAME.mean[c]`` and ``NAME.std[c]``: per channel for an image input (4-D, the channel axis from the preprocess
  layout, else the axis of 1, 3 or 4 elements), else over the whole tensor (``NAME.mean``, ``NAME.std``);
- ``NAME.cell[i]``: the mean of each cell of a 4 x 4 grid over the image (channels averaged, row by row), which a
  rotation or a shifted crop moves while the pixel histogram stays put; for an input that is not an image, the mean
  of each of 16 equal runs of its flattened values (fewer for a tensor of fewer elements; none for a scalar);
- ``NAME.smooth``: 1 - E[(v' - v)^2] / (2 var) over neighbouring read values v, v' (pixels of a row, of one
  channel; channels pooled; an offset cancels): the lag-1 autocorrelation of a stationary signal, near 1 for a
  smooth image, lower under sensor noise, higher under blur, which moves neither the means nor much the spread.

At most ``MAX_READ`` elements of an input are read per prediction (an even stride over the flattened tensor beyond,
so "neighbours" are then that stride apart), whatever the input's size; on the device they are copied aside and
summarized in bulk every few predictions (:class:`InputSummary`).

Per output (:class:`OutputSummary`), by the bundle's task:

- classification: ``max_prob``, ``margin`` (top-1 minus top-2) and ``entropy`` (normalized to [0, 1]), the
  hardness signals of hybrid mode, from the class probabilities (softmax applied when the task says), and
  ``predicted_class`` (categorical; up to ``MAX_CLASSES`` classes);
- detection: ``count``, ``mean_score``, and the hardness signals ``uncertain_share``, ``min_kept_score``;
- segmentation: ``coverage`` (share of the image under a mask), ``uncertain_pixel_share``;
- text: ``length``, ``min_char_confidence``, ``mean_margin``;
- regression, probability: ``value`` (the mean of the values), ``threshold_distance``;
- embedding: ``norm`` (of the raw output); landmarks, raw: ``OUTPUT.mean``, ``OUTPUT.std`` of the first outputs.

A signal a prediction gives nothing for (no detection kept: no ``min_kept_score``) is NaN and left out of its
histogram.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Sequence

import numpy as np

from ..choices import TaskType
from ..tasks.hardness import signals as task_signals
from ..tasks.spec import TaskSpec

GRID = 4  # cells per side of the grid over an image input
RUNS = GRID * GRID  # runs of a flattened non-image input
MAX_READ = 16384  # elements of one input read per prediction
MAX_CLASSES = 32  # predicted_class is kept up to this many classes
MAX_RAW_OUTPUTS = 4  # outputs summarized for the landmarks and raw tasks
DYNAMIC_SIDE = 64  # how a dynamic dimension is planned before a real tensor comes
MAX_PLANS = 32  # tensor shapes whose plans are kept
MAX_PENDING_BYTES = 1 << 20  # read values held for their summaries, per input (InputSummary.hold)
MAX_REFERENCED_BYTES = 64 << 10  # an input the preprocess made, up to this size, is held by reference, not copied
KEEP_SCORES = 1024  # a classifier's scores up to this many classes are kept as they are and summarized in bulk


class InputSummary:
    """The summaries of one model input over a ring of ``window`` predictions: :meth:`hold` (on the device) or
    :meth:`record` (at once) writes one prediction's raw numbers into row ``i``, and :meth:`features` turns the first
    ``n`` rows into the named features (in bulk).

    A row is a few products of the input's read values (centred): with the averaging weights (per channel, per
    cell), with themselves (the sum of squares) and with their neighbours. On the device, :meth:`hold` only copies
    the read values into a small buffer of ``pending`` rows (one numpy call: each costs a microsecond or two in the
    cold cache an inference leaves) and the rows are made for the whole buffer at once when it is full or when
    :meth:`features` reads the ring; the buffer is then zeroed. So the read values of at most ``pending`` recent
    predictions (at most ``MAX_PENDING_BYTES``) are held in memory between two summaries: never in a snapshot, a
    sink or an export. ``pending=1`` summarizes every prediction at once (nothing held after the call)."""

    def __init__(self, name: str, shape: Sequence[int], layout: str | None = None, window: int = 1,
                 center: float = 0.0, pending: int = 1):
        self.name = name
        # subtracted from every value before the sums (the middle of the calibrated range, the same at quantize
        # time and on the device): the spread and the smoothness are differences of sums, which an offset swamps
        self.center = float(center) if math.isfinite(center) else 0.0
        self.shape = tuple(int(d) for d in shape)
        self.layout = layout
        self._plans: dict[tuple[int, ...], _Plan] = {}
        # a dynamic dimension (-1, 0) is planned as DYNAMIC_SIDE: as many cells and runs as a real tensor of a
        # few pixels or values has (a fast path that no real shape takes: those are planned when they come)
        self._first_shape = tuple(int(d) if int(d) > 0 else DYNAMIC_SIDE for d in self.shape)
        self._first = plan = self._plan(self._first_shape)
        self.channels, self.cells = plan.channels, plan.cells
        self._split = k = self.channels + self.cells
        self.names = self._names()
        # per row: means per channel and cell, the sum of squares, the sum of neighbours' products (float64: a
        # spread is a difference of two such sums)
        self.ring = np.full((window, k + 2), np.nan)
        # per channel means of squares, for several channels (the pooled sum is in ring)
        self.squares = None if self.channels == 1 else np.full((window, self.channels), np.nan)
        self._pending_rows = max(1, min(int(pending), window))
        self._held: np.ndarray | None = None  # the read values waiting for their rows (made at the first hold)
        self._slots: list[np.ndarray] = []  # its rows, as hold() writes them
        self._lock = threading.Lock()  # the buffer's: a thread's slot is never another's, nor zeroed under it
        self._step = 1
        self._held_at: list[int] = []  # the ring row of each held one (-1: cleared)

    def _names(self) -> list[str]:
        if self.channels == 1:
            stats = [f"{self.name}.mean", f"{self.name}.std"]
        else:
            stats = [f"{self.name}.mean[{c}]" for c in range(self.channels)] + \
                    [f"{self.name}.std[{c}]" for c in range(self.channels)]
        return stats + [f"{self.name}.cell[{i}]" for i in range(self.cells)] + \
            ([f"{self.name}.smooth"] if self._first.lag else [])

    def hold(self, x: np.ndarray, i: int, owned: bool = False) -> None:
        """Keep one prediction's read values for row ``i``; its row is made with the others when the buffer is
        full or :meth:`features` runs. A tensor of another shape than the manifest's is recorded at once.

        ``owned``: ``x`` was made for this prediction (by the bundle's preprocess) and nobody writes to it again, so a
        small one (up to ``MAX_REFERENCED_BYTES``) is kept by reference until the summary copies it, instead of
        being copied now: the copy right after an inference is most of what a prediction costs the monitor."""
        if x.shape == self._first_shape and self._slots:  # the path every prediction takes: one copy, or none
            with self._lock:  # predictions on other threads (edgesdk serve's) take their own slots
                held = self._held_at
                j = len(held)
                if owned and x.nbytes <= MAX_REFERENCED_BYTES:
                    self._refs[j] = x
                else:
                    # an item assignment casts as copyto(casting="unsafe") does, in half its time
                    self._slots[j][...] = x if self._step == 1 else x.reshape(-1)[::self._step]
                held.append(i)
                if j + 1 >= self._pending_rows:
                    self._summarize_held()
        elif x.shape == self._first_shape:
            with self._lock:
                if not self._slots:
                    self._start_holding(x)
            self.hold(x, i)
        else:
            self.record(x, i)

    def _start_holding(self, x: np.ndarray) -> None:
        plan = self._first
        rows = max(1, min(self._pending_rows, MAX_PENDING_BYTES // max(1, plan.count * x.dtype.itemsize)))
        self._pending_rows = rows
        self._held = np.zeros((rows, plan.count), dtype=x.dtype if x.dtype.kind in "fiub" else np.float64)
        self._step = plan.step
        # one view per slot, shaped like the input when every value is read (no reshape per prediction)
        self._slots = [row.reshape(self._first_shape) if plan.step == 1 else row for row in self._held]
        self._refs: list[np.ndarray | None] = [None] * rows  # the slots' inputs kept by reference (hold's owned)

    def summarize_held(self) -> None:
        """Make the rows of the held predictions (in bulk) and zero the buffer."""
        with self._lock:
            self._summarize_held()

    def _summarize_held(self) -> None:
        at, self._held_at = self._held_at, []
        if not at:
            return
        m = len(at)
        for j, x in enumerate(self._refs[:m]):  # the inputs kept by reference are copied now, in one go
            if x is not None:
                self._slots[j][...] = x if self._step == 1 else x.reshape(-1)[::self._step]
                self._refs[j] = None
        values = self._held[:m]
        try:
            rows, squares = self._rows_of(values, self._first)
        finally:
            values[...] = 0
        keep = [j for j, i in enumerate(at) if i >= 0]
        if len(keep) < m:
            rows, squares = rows[keep], None if squares is None else squares[keep]
            at = [at[j] for j in keep]
        self.ring[at] = rows
        if self.squares is not None:
            self.squares[at] = squares

    def record(self, x: np.ndarray, i: int) -> None:
        """Write one prediction's raw numbers into row ``i`` at once. A tensor of another shape than the manifest's
        (a dynamic dimension) gets its own plan with the same number of channels and cells, or NaN when it cannot
        have them."""
        plan = self._first
        if x.shape != self._first_shape:
            plan = self._plans.get(x.shape) or self._plan(x.shape)
            if plan.channels != self.channels or plan.cells != self.cells or bool(plan.lag) != bool(self._first.lag):
                self.clear(i)
                return
        flat = x.reshape(-1)
        rows, squares = self._rows_of((flat[::plan.step] if plan.step > 1 else flat)[None, :], plan)
        self.ring[i] = rows[0]
        if self.squares is not None:
            self.squares[i] = squares[0]

    def _rows_of(self, values: np.ndarray, plan: "_Plan") -> tuple[np.ndarray, np.ndarray | None]:
        """The rows (and the per channel sums of squares) of ``values``: one prediction's read values per row."""
        v = values.astype(np.float64) - self.center
        k, first = self._split, self._first
        rows = np.empty((len(v), k + 2))
        rows[:, :k] = v @ plan.means.T
        vv = v * v
        # the sums on the first plan's scale: features() divides them by its counts
        rows[:, k] = vv.sum(axis=1) * (first.count / plan.count)
        lag = plan.lag
        rows[:, k + 1] = np.einsum("ij,ij->i", v[:, lag:], v[:, :plan.count - lag]) * (
            (first.count - first.lag) / (plan.count - lag)) if lag else 0.0
        return rows, (None if self.squares is None else vv @ plan.squares.T)

    def clear(self, i: int) -> None:
        """Row ``i`` holds no prediction (NaN: left out of every feature)."""
        with self._lock:
            self._held_at[:] = [-1 if at == i else at for at in self._held_at]
        self.ring[i] = np.nan
        if self.squares is not None:
            self.squares[i] = np.nan

    def features(self, n: int) -> np.ndarray:
        """The first ``n`` rows as features (n x ``len(names)``): mean, std per channel, the cells, smoothness."""
        self.summarize_held()
        c, k, first = self.channels, self._split, self._first
        rows = self.ring[:n]
        means, cells = rows[:, :c], rows[:, c:k]
        pooled = rows[:, k] / first.count  # the mean square over every read value
        squares = pooled[:, None] if self.squares is None else self.squares[:n]
        std = np.sqrt(np.maximum(squares - means * means, 0.0))
        columns = [means + self.center, std, cells + self.center]
        if first.lag:
            # 1 - E[(v_k+1 - v_k)^2] / (2 var): the lag-1 autocorrelation of a stationary signal, computed without
            # the mean (an offset cancels), channels pooled: near 1 for a smooth image, lower with noise
            m = means.mean(axis=1)
            spread = pooled - m * m
            neighbours = rows[:, k + 1] / (first.count - first.lag)
            with np.errstate(divide="ignore", invalid="ignore"):
                smooth = np.where(spread > 1e-12 * np.maximum(pooled, 1.0), 1.0 - (pooled - neighbours) / spread,
                                  np.nan)
            columns.append(smooth[:, None])
        return np.concatenate(columns, axis=1)

    def _plan(self, shape: tuple[int, ...]) -> "_Plan":
        plan = _Plan(shape, self.layout)
        if len(self._plans) < MAX_PLANS:  # the dynamic shapes seen first; more are planned each time (rare)
            self._plans[shape] = plan
        return plan


class _Plan:
    """For one tensor shape: the stride, and the matrices that average the read elements per channel and cell."""

    def __init__(self, shape: tuple[int, ...], layout: str | None):
        n = int(np.prod(shape)) if shape else 1
        self.step = max(1, math.ceil(n / MAX_READ))
        idx = np.arange(0, n, self.step)
        axes = _image_axes(shape, layout)
        if axes is not None:
            c_axis, h_axis, w_axis = axes
            coords = np.unravel_index(idx, shape)
            h, w = shape[h_axis], shape[w_axis]
            gh, gw = min(GRID, h), min(GRID, w)
            channel = coords[c_axis]
            cell = (coords[h_axis] * gh // h) * gw + coords[w_axis] * gw // w
            self.channels, self.cells = shape[c_axis], gh * gw
        else:
            runs = min(RUNS, n) if n > 1 else 0
            channel = np.zeros(idx.size, dtype=np.int64)
            cell = idx * runs // n if runs else None
            self.channels, self.cells = 1, runs
        means = np.zeros((self.channels + self.cells, idx.size))
        cols = np.arange(idx.size)
        means[channel, cols] = 1.0
        if cell is not None:
            means[self.channels + cell, cols] = 1.0
        means /= np.maximum(means.sum(axis=1, keepdims=True), 1.0)
        self.means = means
        self.squares = np.ascontiguousarray(means[:self.channels])
        self.count = idx.size
        # neighbours among the read values: the next pixel in the row (nchw, no channels), the next pixel of the
        # same channel (nhwc); none for a tensor of fewer than 3 values
        self.lag = (self.channels if axes is not None and axes[0] == 3 else 1) if idx.size > 2 else 0
        if self.lag >= idx.size:
            self.lag = 0


def _image_axes(shape: tuple[int, ...], layout: str | None) -> tuple[int, int, int] | None:
    """(channel, height, width) axes of a 4-D image tensor, None for a tensor that is not one."""
    if len(shape) != 4:
        return None
    if layout == "nchw" or (layout is None and shape[1] in (1, 3, 4) and shape[3] not in (1, 3, 4)):
        return 1, 2, 3
    if layout == "nhwc" or (layout is None and shape[3] in (1, 3, 4)):
        return 3, 1, 2
    return None


class OutputSummary:
    """The task's summary of each prediction's outputs (module docstring) over a ring of ``window`` predictions.
    For a classifier with up to ``KEEP_SCORES`` classes, :meth:`record` copies the scores and :meth:`features`
    summarizes them in bulk; other tasks decode each prediction (the result's own decoding, shared with the app)
    and keep the numbers."""

    def __init__(self, spec: TaskSpec, output_names: Sequence[str], output_shapes: Sequence[Sequence[int]],
                 softmax: bool, window: int = 1):
        self.spec, self.output_names, self.softmax = spec, list(output_names), softmax
        self.kind = spec.type
        self.scores_at = 0
        self.classes = 0
        if self.kind is TaskType.CLASSIFICATION:
            self.scores_at = spec.output_index("scores", self.output_names) or 0
            self.classes = int(np.prod([max(int(d), 1) for d in output_shapes[self.scores_at]]))
        self.bulk = self.kind is TaskType.CLASSIFICATION and self.classes <= KEEP_SCORES
        self.names = self._names(output_shapes)
        self.categorical = {"predicted_class"} if "predicted_class" in self.names else set()
        # a classifier's scores: the array the engine returned (a fresh copy per prediction), kept by reference
        # until the next features() summarizes them in bulk into ring (a list store per prediction); other tasks
        # write their numbers into ring at once
        self.scores: list[np.ndarray | None] = [None] * window
        self.ring = np.full((window, len(self.names)), np.nan)

    def _names(self, shapes) -> list[str]:
        kind = self.kind
        if kind is TaskType.CLASSIFICATION:
            return ["max_prob", "margin", "entropy"] + (["predicted_class"] if 1 < self.classes <= MAX_CLASSES else [])
        if kind is TaskType.DETECTION:
            return ["count", "mean_score", "uncertain_share", "min_kept_score"]
        if kind is TaskType.SEGMENTATION:
            return ["coverage", "uncertain_pixel_share"]
        if kind is TaskType.TEXT:
            return ["length", "min_char_confidence", "mean_margin"]
        if kind in (TaskType.REGRESSION, TaskType.PROBABILITY):
            return ["value", "threshold_distance"]
        if kind is TaskType.EMBEDDING:
            return ["norm"]
        names = self.output_names[:MAX_RAW_OUTPUTS]
        return [f"{n}.{stat}" for n in names for stat in ("mean", "std")]

    def record(self, outputs: Sequence[np.ndarray], decoded: Any, i: int) -> None:
        """Write one prediction's numbers into row ``i``. ``decoded``: a callable giving the task's
        :class:`~edgesdk.tasks.results.Decoded` (called only for the tasks that need it)."""
        if self.bulk:
            self.scores[i] = outputs[self.scores_at]  # summarized at the next features()
            return
        self.ring[i] = self.values(outputs, decoded)

    def clear(self, i: int) -> None:
        self.scores[i] = None
        self.ring[i] = np.nan

    def features(self, n: int) -> np.ndarray:
        """The first ``n`` rows as features (n x ``len(names)``). A classifier's scores kept since the last call
        are summarized now (and let go)."""
        if self.bulk:
            pending = [j for j in range(len(self.scores)) if self.scores[j] is not None]
            kept = [j for j in pending if self.scores[j].size == self.classes]
            if kept:
                rows = np.stack([self.scores[j].reshape(-1) for j in kept])
                self.ring[kept] = classifier_features(rows, self.softmax, "predicted_class" in self.names)
            for j in pending:
                if self.scores[j].size != self.classes:
                    self.ring[j] = np.nan
                self.scores[j] = None
        return self.ring[:n]

    def values(self, outputs: Sequence[np.ndarray], decoded: Any) -> list[float]:
        """The named numbers of one prediction, NaN where it gives none."""
        kind = self.kind
        if kind is TaskType.CLASSIFICATION:
            scores = np.asarray(outputs[self.scores_at], dtype=np.float64).reshape(1, -1)
            return list(classifier_features(scores, self.softmax, "predicted_class" in self.names)[0])
        if kind in (TaskType.LANDMARKS, TaskType.RAW):
            vals = []
            for arr in outputs[:MAX_RAW_OUTPUTS]:
                a = np.asarray(arr, dtype=np.float64)
                vals += [float(a.mean()), float(a.std())] if a.size else [math.nan, math.nan]
            return vals
        if kind is TaskType.EMBEDDING:
            a = np.asarray(outputs[0], dtype=np.float64)
            return [float(np.sqrt(np.vdot(a, a)))]
        d = decoded()
        signal = task_signals(self.spec, d, list(outputs), self.output_names)
        if kind is TaskType.DETECTION:
            scores = [det.score for det in d.detections or []]
            return [float(len(scores)), float(np.mean(scores)) if scores else math.nan,
                    _num(signal.get("uncertain_share")), _num(signal.get("min_kept_score"))]
        if kind is TaskType.SEGMENTATION:
            masks = d.masks or []
            # area and shape are counted when decoded: reading .mask would make a full-size array per class
            total = math.prod(masks[0].shape) if masks else 0
            covered = sum(int(m.area) for m in masks)
            return [covered / total if total else 0.0, _num(signal.get("uncertain_pixel_share"))]
        if kind is TaskType.TEXT:
            text = d.text.text if d.text is not None else ""
            return [float(len(text)), _num(signal.get("min_char_confidence")), _num(signal.get("mean_margin"))]
        values = np.asarray(d.values if d.values is not None else [], dtype=np.float64)
        return [float(values.mean()) if values.size else math.nan, _num(signal.get("threshold_distance"))]


def classifier_features(scores: np.ndarray, softmax: bool, predicted: bool) -> np.ndarray:
    """max_prob, margin, normalized entropy (and predicted class) of each row of class scores."""
    s = np.asarray(scores, dtype=np.float64)
    if softmax:
        e = np.exp(s - s.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
    else:
        p = np.clip(s, 0.0, 1.0)
    k = p.shape[1]
    if k > 1:
        top2 = np.partition(p, k - 2, axis=1)[:, -2:]
        best, margin = top2[:, 1], top2[:, 1] - top2[:, 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            entropy = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(axis=1) / math.log(k)
    else:
        best, margin, entropy = p[:, 0], p[:, 0], np.zeros(len(p))
    cols = [best, margin, entropy] + ([np.argmax(p, axis=1).astype(np.float64)] if predicted else [])
    return np.stack(cols, axis=1)


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


__all__ = ["InputSummary", "OutputSummary", "classifier_features", "GRID", "MAX_READ"]
