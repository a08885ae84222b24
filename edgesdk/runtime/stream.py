"""A stateful model's call sequence: :class:`Stream` carries the state from one call to the next.

A recurrent model (Silero VAD, a streaming keyword spotter) takes its previous state as an input and returns the new
one as an output; the manifest's ``state`` section says which output feeds which input (written by ``quantize
--state OUT:IN``). ``model.stream()`` starts a sequence from the initial state (zeros); each ``predict`` takes the
other inputs, feeds the state it holds, keeps the state the model returned and gives the :class:`Result`, whose
outputs include the new state as they always do. ``reset()`` starts over. Each stream is one sequence: open one per
audio stream; several streams on one model run side by side (the model's lock serializes their inferences).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..choices import BackendReason
from ..errors import BackendUnavailable, InputError
from ..result import Result

if TYPE_CHECKING:  # the model imports this module
    from .model import Model


class Stream:
    """One sequence of calls to a stateful model. Thread-safe: concurrent calls on one stream run one after the
    other (each sees the state the previous one left), though one sequence is normally fed from one thread."""

    def __init__(self, model: "Model"):
        manifest = model.bundle.manifest
        pairs = manifest.get("state") or []
        if not pairs:
            raise InputError(f"model {model.bundle.name!r} declares no state (its manifest has no 'state' section): "
                             "stream() is for stateful models; call predict() instead, or re-quantize with "
                             "--state OUTPUT:INPUT")
        self._model = model
        inputs = {t["name"]: (i, t) for i, t in enumerate(manifest["inputs"])}
        outputs = {t["name"]: j for j, t in enumerate(manifest["outputs"])}
        # (output index, input name, zeros of the input's shape and dtype); the schema checked both names and shapes
        self._carried = [(outputs[p["output"]], p["input"], _zeros(inputs[p["input"]][1])) for p in pairs]
        # what a step takes: every input but the state and those the model was specialized for (filled in)
        self._given = [name for name, (_, spec) in inputs.items()
                       if name not in {p["input"] for p in pairs} and "fixed" not in spec]
        self._lock = threading.Lock()
        self._state: dict[str, np.ndarray] = {}
        self.reset()

    @property
    def inputs(self) -> list[str]:
        """The inputs each call takes (the model's inputs but the state)."""
        return list(self._given)

    @property
    def state(self) -> dict[str, np.ndarray]:
        """A copy of the state the next call will feed, by input name."""
        with self._lock:
            return {name: arr.copy() for name, arr in self._state.items()}

    def reset(self) -> None:
        """Start over from the initial state (zeros)."""
        with self._lock:
            self._state = {name: zeros.copy() for _, name, zeros in self._carried}

    def predict(self, x: Any) -> Result:
        """Run one step: ``x`` is a ``{input name: array}`` dict of the inputs but the state (or, when the model
        takes one input besides its state, that input alone). Returns the model's :class:`Result`; the state outputs
        become the next call's state. A step that fails leaves the state as it was."""
        t0 = time.perf_counter()
        if not isinstance(x, dict):
            if len(self._given) != 1:
                raise InputError(f"model {self._model.bundle.name!r} streams {len(self._given)} inputs "
                                 f"({', '.join(self._given)}) besides its state: pass a {{name: array}} dict")
            x = {self._given[0]: x}
        carried = [name for _, name, _ in self._carried if name in x]
        if carried:
            raise InputError(f"the stream carries input(s) {', '.join(map(repr, carried))} itself (the model's state); "
                             f"pass only {', '.join(map(repr, self._given))}, or call reset() to start over")
        with self._lock:
            feeds = self._model.io.feeds({**x, **self._state})
            result = self._model.run_prepared(feeds, t0)
            for j, name, zeros in self._carried:
                if result.outputs[j].size != zeros.size:
                    raise BackendUnavailable(BackendReason.RUN_FAILED, (
                        f"model {self._model.bundle.name!r} returned {result.outputs[j].size} values for its state "
                        f"output {j}, which feeds input {name!r} of shape {list(zeros.shape)}: the artifact does not "
                        "match its manifest; the stream keeps its state"))
            self._state = {name: np.array(result.outputs[j], dtype=zeros.dtype).reshape(zeros.shape)
                           for j, name, zeros in self._carried}
        return result

    def __repr__(self) -> str:
        return f"<edgesdk.Stream of {self._model.bundle.name!r}: carries {', '.join(n for _, n, _ in self._carried)}>"


def _zeros(spec: dict) -> np.ndarray:
    try:
        dtype = np.dtype(spec["dtype"])
    except (TypeError, ValueError, SyntaxError):
        dtype = np.dtype(np.float32)
    return np.zeros(spec["shape"], dtype=dtype)


__all__ = ["Stream"]
