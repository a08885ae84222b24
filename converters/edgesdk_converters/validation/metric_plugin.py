"""A user's own validation metric (``quantize --metric module:function``): :func:`load_metric` finds it,
:class:`PluginScore` calls it on every validation sample and keeps the mean.

The function is called as ``function(outputs, reference, label, task) -> float``: this artifact's raw outputs and
its reference's (lists of numpy arrays in the manifest's output order, read-only), the sample's integer label or
None, and the bundle's :class:`~edgesdk.tasks.TaskSpec`. It returns a score in [0, 1], 1 meaning "as the
reference"; the gate's drop is ``100 * (1 - mean score)`` points and replaces the task's own gate (whose numbers
are still reported). A function that cannot be found, raises, calls ``sys.exit`` (at import or when called), or
returns anything but a number in [0, 1] (``10**400`` included: no float holds it) is a
:class:`~edgesdk.errors.ConversionError` naming it.
"""

from __future__ import annotations

import importlib
import math
import numbers
from typing import Any, Callable

import numpy as np

from edgesdk.errors import ConversionError
from edgesdk.tasks import TaskSpec

DEFAULT_MAX_DROP = 5.0  # points of the plug-in's mean score, when --max-drop is not given

Metric = Callable[[list[np.ndarray], list[np.ndarray], Any, TaskSpec], float]


def load_metric(metric: str | Metric) -> Metric:
    """The function ``metric`` names (``"package.module:function"``, or ``module:Class.method``), imported; a
    callable is returned as it is. Any problem is a :class:`ConversionError` saying which part is wrong."""
    if callable(metric):
        return metric
    if not isinstance(metric, str) or metric.count(":") != 1 or not all(metric.split(":")):
        raise ConversionError(f"metric must be 'module:function' (e.g. 'mymetrics:agreement'), got {metric!r}")
    module_name, attr = metric.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConversionError(f"metric {metric!r}: no module named {exc.name or module_name!r} (is it on the "
                              f"Python path, e.g. in the current directory or installed?)") from exc
    except SystemExit as exc:  # the user's code ending the process would end quantize, exit 0, nothing written
        raise ConversionError(f"metric {metric!r}: importing module {module_name!r} called sys.exit({exc.code!r}); "
                              "a metric module must not exit") from exc
    except Exception as exc:  # the module itself fails while importing: the user's code, any error
        raise ConversionError(f"metric {metric!r}: importing module {module_name!r} failed: "
                              f"{type(exc).__name__}: {exc}") from exc
    found: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(found, part):
            where = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            names = sorted(n for n in dir(found) if not n.startswith("_") and callable(getattr(found, n, None)))
            raise ConversionError(f"metric {metric!r}: {where} has no {part!r} (its functions: "
                                  f"{', '.join(names[:20]) or 'none'})")
        found = getattr(found, part)
    if not callable(found):
        raise ConversionError(f"metric {metric!r} is a {type(found).__name__}, not a function")
    return found


def metric_name(metric: str | Metric) -> str:
    """How the manifest and the report name ``metric``: as given, or a function's ``module:qualname``."""
    if isinstance(metric, str):
        return metric
    return f"{getattr(metric, '__module__', None) or '?'}:{getattr(metric, '__qualname__', type(metric).__name__)}"


class PluginScore:
    """The running mean of a plug-in's scores for one artifact against its reference."""

    def __init__(self, function: Metric, name: str) -> None:
        self.function, self.name = function, name
        self.sum, self.n = 0.0, 0

    def add(self, outputs: list[np.ndarray], reference: list[np.ndarray], label: Any, task: TaskSpec) -> None:
        try:
            score = self.function(_read_only(outputs), _read_only(reference), label, task)
        except SystemExit as exc:
            raise ConversionError(f"metric {self.name} called sys.exit({exc.code!r}); a metric returns a score") \
                from exc
        except Exception as exc:  # the user's code: whatever it raises fails the validation, named
            raise ConversionError(f"metric {self.name} raised {type(exc).__name__}: {exc}") from exc
        if isinstance(score, np.ndarray) and score.size == 1:
            score = score.reshape(()).item()
        if isinstance(score, bool) or not isinstance(score, numbers.Real):
            raise ConversionError(f"metric {self.name} returned {_shown(score)}, not a number (a score in [0, 1], "
                                  f"1 = as the reference)")
        try:
            value = float(score)
        except (OverflowError, ValueError, TypeError) as exc:  # an int past float's range; a Real that will not
            raise ConversionError(f"metric {self.name} returned {_shown(score)}, outside [0, 1] (1 = as the "
                                  f"reference)") from exc
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise ConversionError(f"metric {self.name} returned {value!r}, outside [0, 1] (1 = as the reference)")
        score = value
        self.sum, self.n = self.sum + score, self.n + 1

    def value(self) -> float:
        return self.sum / self.n if self.n else 1.0

    def drop(self) -> float:
        return 100.0 * (1.0 - self.value())


def _read_only(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Views the plug-in cannot write through (the same arrays serve the other comparisons)."""
    views = []
    for a in arrays:
        view = np.asarray(a).view()
        view.flags.writeable = False
        views.append(view)
    return views


def _shown(value: Any) -> str:
    """``value``'s type and the start of its repr; a huge int by its digits (Python refuses to print past 4300)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 60:
        digits = int(math.log10(abs(value))) + 1
        return f"int {str(value)[:40] + '... ' if digits <= 4000 else ''}({digits} digits)"
    try:
        text = repr(value)
    except Exception as exc:  # the user's object: its repr may fail too
        text = f"<repr failed: {type(exc).__name__}>"
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
