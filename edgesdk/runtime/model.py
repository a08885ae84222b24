"""The loaded :class:`Model`: one bundle on one engine, predicting under a lock and the budgets. How it was
chosen and opened is :mod:`edgesdk.runtime.loading`'s; what a hot device changes while it serves is
:mod:`edgesdk.runtime.thermal_serving`'s. Its placement and budget state are values (:mod:`edgesdk.frozen`), made once when
they change and shared by its results.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Sequence

import numpy as np

from ..budgets import memory
from ..bundle.reader import Bundle
from ..bundle.tensors import BundleIO
from ..choices import BackendReason, BudgetReason, MonitorResponse
from ..engines import Engine
from ..errors import BackendUnavailable, BudgetExceeded, InputError
from ..frozen import freeze
from ..lifecycle import Closeable
from ..monitor.identity import fingerprint, version_identity
from ..monitor.monitor import Monitor, MonitorOptions
from ..tasks.geometry import Transform
from .float_response import FloatResponse
from .placement import Candidate, Placement
from .thermal_serving import ThermalServing
from ..result import Result
from .stream import Stream


class Model(Closeable):
    """A bundle loaded on one backend. Thread-safe: a lock serializes inference on the one engine
    instance, so concurrent calls return exactly what sequential calls return."""

    def __init__(self, bundle: Bundle, engine: Engine, placement: Placement, budget: dict | None = None,
                 thermal: Any = None, cost_mb: float = 0.0, threads: int | None = None,
                 alternatives: Sequence[Candidate] = (), check_numerics: bool = True,
                 engine_options: dict[str, Any] | None = None, isolate: bool = False,
                 monitor: MonitorOptions | None = None):
        self.bundle = bundle
        self.placement = placement  # where load put it; a result's placement is where it really ran
        self.budget = freeze(budget or {})  # read-only: shared by the results (Result.budget), never copied per call
        self.cost_mb = cost_mb
        self._thermal = None if thermal is None else \
            ThermalServing(thermal, bundle, engine, placement, self.budget, threads, alternatives, check_numerics,
                           engine_options, isolate)
        self._engine = engine
        self._lock = threading.Lock()
        limit_mb = (self.budget.get("memory") or {}).get("limit_mb")
        # the room the memory budget leaves when a large image is about to be decoded
        self.io = BundleIO(bundle, None if limit_mb is None else lambda: limit_mb - memory.rss_mb())
        # bound once: called on every prediction
        self._feeds, self._prepare, self._top, self._decode = self.io.feeds, self.io.prepare, self.io.top, self.io.decode
        self._fingerprint: str | None = None
        #: The :class:`~edgesdk.monitor.Monitor` watching this model (None when loaded with ``monitor=False``).
        self._float = None  # the monitor's float_artifact response, when asked for
        if monitor is not None and MonitorResponse.FLOAT_ARTIFACT in monitor.respond.values():
            if thermal is not None:
                raise InputError("monitor respond float_artifact cannot be combined with a thermal budget: both "
                                 "choose the artifact a model serves (use refuse or escalate_more with thermal)")
            self._float = FloatResponse(bundle, placement, threads, check_numerics, engine_options, isolate)
        self._serving = placement  # where the float response put it (load's placement without one)
        self.monitor = None if monitor is None else Monitor.for_bundle(bundle, self.identity, monitor, self.io)

    @property
    def labels(self) -> list[str] | None:
        return self.io.labels

    @property
    def busy(self) -> bool:
        """Whether an inference is running on this model at this moment (a :class:`~edgesdk.ModelPool` unloads only
        models that are not)."""
        return self._lock.locked()

    @property
    def parallel_requests(self) -> int:
        """How many inferences :meth:`predict_batch` keeps in flight (more than 1 only with
        ``performance="throughput"`` on an engine that overlaps them)."""
        engine = self._engine
        return engine.parallel_requests if engine is not None else 1

    # -- inference ------------------------------------------------------------
    def predict(self, x: Any) -> Result:
        """Predict one input: an image (path, PIL image, uint8 HxW[xC] array), preprocessed per the
        manifest; or a float array of the model's input shape (with or without the batch axis);
        or, for several inputs, a list or a {name: array} dict."""
        t0 = time.perf_counter()
        try:
            feeds, transform = self._prepare(x)
            return self._run(feeds, t0, transform)
        except Exception as exc:
            if self.monitor is not None and not _refusal(exc):
                self.monitor.failed(_reason(exc))
            raise

    def run_prepared(self, feeds: Sequence[np.ndarray], started: float | None = None,
                     transform: Transform | None = None) -> Result:
        """Run input tensors that are already prepared, under the lock and the budgets, as :meth:`predict` does once
        it has prepared its input.

        ``feeds``: one array per model input, in the manifest's order, as ``model.io.feeds(x)`` returns them (each
        of the input's dtype and shape, batch axis included). They are not checked again: an array of another shape
        or dtype fails in the engine, as :class:`BackendUnavailable` ``run_failed``. ``started``: the
        ``time.perf_counter()`` at which preparing them began, so that ``timings_ms["preprocess"]`` covers it
        (None: 0 ms). ``transform``: where the input's pixels lie in the original image (``model.io.prepare(x)``
        gives it), for the task's decoding (None: the model input's own pixels). For callers that prepare inputs themselves: :class:`~edgesdk.hybrid.model.HybridModel` (prepared
        once for the device or the cloud) and calibrate-escalation."""
        try:
            return self._run(feeds, started, transform)
        except Exception as exc:
            if self.monitor is not None and not _refusal(exc):
                self.monitor.failed(_reason(exc))
            raise

    def _run(self, feeds: Sequence[np.ndarray], t0: float | None, transform: Transform | None) -> Result:
        monitor = self.monitor
        with self._lock:
            if self._engine is None:
                raise InputError(f"model {self.bundle.name!r} was closed")
            placement, budget = self.placement, self.budget
            if self._float is not None:
                placement = self._follow_monitor(monitor)
            if self._thermal is not None:
                # The governor may pace (sleep), cut threads, switch backend, or refuse (BudgetExceeded "thermal").
                budget = self._thermal.admit()
                self._engine, placement = self._thermal.engine, self._thermal.placement
            t1 = time.perf_counter()
            if t0 is None:
                t0 = t1
            try:
                outputs = self._engine.run_prepared(feeds)  # prepared (validated, converted) by io.feeds
            except Exception as exc:  # engine errors enter the edgesdk tree here, chained
                raise BackendUnavailable(BackendReason.RUN_FAILED, f"{placement.engine}:{placement.device} failed "
                                                                   f"on {placement.artifact}: {exc}") from exc
        t2 = time.perf_counter()
        _check_finite(outputs, self.bundle.name)
        pre, inf = (t1 - t0) * 1e3, (t2 - t1) * 1e3
        result = Result(outputs, placement, {"preprocess": pre, "inference": inf}, budget=budget, _topk=self._top,
                        _decoder=self._decode, _transform=transform)
        if monitor is not None:
            # feeds an image's preprocess made (a transform says so) are this prediction's own: held, not copied
            monitor.observe(feeds, outputs, pre, inf, result, placement.artifact, transform is not None)
            if monitor.refusing:  # the model ran and the monitor saw it (so the alert can clear), but no answer
                raise _refused(self.bundle.name, monitor)
        return result

    def _follow_monitor(self, monitor: Monitor) -> Placement:
        """Under the lock: the float_artifact response's engine and placement for this inference."""
        if monitor.wants_float is not self._float.on_float:
            self._engine, self._serving = self._float.follow(monitor.wants_float, self._engine, self._serving)
        return self._serving

    def predict_batch(self, xs: Sequence[Any]) -> list[Result]:
        """Predict several inputs (each as :meth:`predict` takes it); results in the same order.

        Artifacts are compiled for batch 1, so each input is its own inference. Loaded with
        ``performance="throughput"``, OpenVINO overlaps them on parallel streams; otherwise (and under a
        thermal budget, which decides before each inference) they run one after the other. Every input is
        checked before any runs. A result's ``timings_ms["inference"]`` is the batch's inference time
        divided by its size.
        """
        xs = list(xs)  # any iterable of inputs
        if self._thermal is not None or len(xs) < 2:
            return [self.predict(x) for x in xs]
        try:
            return self._run_batch(xs)
        except Exception as exc:
            if self.monitor is not None and not _refusal(exc):
                self.monitor.failed(_reason(exc))
            raise

    def _run_batch(self, xs: list[Any]) -> list[Result]:
        t0 = time.perf_counter()
        prepared = [self._prepare(x) for x in xs]
        batch = [feeds for feeds, _ in prepared]
        with self._lock:
            if self._engine is None:
                raise InputError(f"model {self.bundle.name!r} was closed")
            placement = self._serving if self._float is None else self._follow_monitor(self.monitor)
            t1 = time.perf_counter()
            try:
                outputs = self._engine.run_many(batch)
            except Exception as exc:  # engine errors enter the edgesdk tree here, chained
                raise BackendUnavailable(BackendReason.RUN_FAILED, f"{placement.engine}:{placement.device} failed "
                                                                   f"on {placement.artifact}: {exc}") from exc
        t2 = time.perf_counter()
        for i, out in enumerate(outputs):
            _check_finite(out, self.bundle.name, f"input {i} of the batch")
        timings = {"preprocess": (t1 - t0) * 1e3 / len(batch), "inference": (t2 - t1) * 1e3 / len(batch)}
        results = [Result(out, placement, dict(timings), budget=self.budget, _topk=self._top, _decoder=self._decode,
                          _transform=transform) for out, (_, transform) in zip(outputs, prepared)]
        if self.monitor is not None:
            for feeds, result in zip(batch, results):
                self.monitor.observe(feeds, result.outputs, timings["preprocess"], timings["inference"], result,
                                     placement.artifact)
            if self.monitor.refusing:
                raise _refused(self.bundle.name, self.monitor)
        return results

    def stream(self) -> "Stream":
        """A :class:`~edgesdk.runtime.stream.Stream` over this stateful model: each ``predict`` feeds the state the
        previous one returned (starting from zeros), as the manifest's ``state`` section says; ``reset()`` starts
        over. An :class:`InputError` for a bundle that declares no state."""
        return Stream(self)

    # -- lifetime -------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """What every monitor figure is about (:func:`edgesdk.monitor.identity.version_identity`): the bundle (name,
        version, fingerprint), where it runs now (artifact, engine and its version, device, precision), the CPU
        class and the edgesdk version."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.bundle)
        p = self._thermal.placement if self._thermal is not None else self._serving
        return version_identity(self.bundle, self._fingerprint, p.artifact, p.engine, p.device, p.precision)

    def close(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.close()
                self._engine = None
        if self.monitor is not None:
            self.monitor.close()

    def __repr__(self) -> str:
        return f"<edgesdk.Model {self.bundle.name!r} on {self.placement}>"


def _refused(name: str, monitor: Monitor) -> BudgetExceeded:
    return BudgetExceeded(BudgetReason.MONITOR, f"model {name!r} refuses while its monitor is at alert on "
                                                f"{', '.join(monitor.refusing)} (MonitorOptions.respond)")


def _refusal(exc: BaseException) -> bool:
    """A refusal the app asked the monitor for: a decision, not an error of the model."""
    return isinstance(exc, BudgetExceeded) and exc.reason is BudgetReason.MONITOR


def _reason(exc: BaseException) -> str:
    """An error's reason code for the monitor's error counts (its type's name when it has none)."""
    reason = getattr(exc, "reason", None)
    return str(reason) if reason is not None else type(exc).__name__


def _check_finite(outputs: Sequence[np.ndarray], name: str, which: str = "the input") -> None:
    """Refuse outputs holding NaN or Inf: inputs are checked finite before they run, so a non-finite answer means
    values the model cannot take (e.g. 3e38 everywhere overflows its first layer). The numerics check holds loaded
    models to finite golden outputs, so a served model never answers NaN for what it was built for."""
    for j, out in enumerate(outputs):
        if out.dtype.kind != "f":
            continue
        # one BLAS pass (NaN and Inf propagate into the sum of squares); the exact check only when it overflows
        if not math.isfinite(float(np.vdot(out, out))) and not np.isfinite(out).all():
            raise InputError(f"model {name!r} gave NaN or Inf in output {j} for {which}: its values are outside what "
                             f"the model can take (finite, but too large in magnitude for its arithmetic)")


__all__ = ["Model"]
