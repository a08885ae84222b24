"""What each thermal level does (:class:`ThermalActions`): fewer threads, pacing, a lower-power backend, and at
critical refuse, defer or escalate; checked when built, naming the level and key."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...choices import CriticalMode
from ...errors import InputError


_LEVEL_KEYS = {"threads": None, "min_interval_ms": 0.0, "adaptive": False, "prefer": None}
_CRITICAL_KEYS = {"mode": "refuse", "max_wait_s": 30.0}
CRITICAL_MODES = tuple(CriticalMode)


@dataclass(frozen=True)
class ThermalActions:
    """What the governor does at each level above nominal.

    ``warm`` and ``hot`` take (a key left out does nothing):

    - ``threads``: CPU threads per inference, an integer or ``"half"`` (of the governor's ``max_threads``);
    - ``min_interval_ms``: least time between the starts of two inferences (fixed pacing);
    - ``adaptive``: also pace adaptively, holding the temperature at the governor's ``hold_c`` (needs a sensor
      that reports a temperature; see :class:`ThermalGovernor`);
    - ``prefer``: a hint for the runtime, ``"lower_power"``: serve from a lower-power backend or artifact.

    ``critical`` takes ``mode``: ``"refuse"`` (raise :class:`BudgetExceeded`, reason ``thermal``), ``"defer"``
    (wait until the level is below hot, at most ``max_wait_s``, then serve; refuse after that) or ``"escalate"``
    (the decision says ``escalate``: the hook for hybrid mode to serve from the cloud; without it, refuse).

    The defaults pace adaptively from warm on: with fixed pacing only, nothing slows the heating between warm and
    hot, and a fast-heating device passes the hot limit within one sensor read. A rate limit learned at warm is
    carried down to nominal (results there may say ``paced``) until it no longer binds, the app idles, or the
    temperature is two hysteresis steps below warm.
    """

    warm: dict = field(default_factory=lambda: {"threads": "half", "min_interval_ms": 0, "adaptive": True})
    hot: dict = field(default_factory=lambda: {"threads": 1, "min_interval_ms": 100, "adaptive": True,
                                               "prefer": "lower_power"})
    critical: dict = field(default_factory=lambda: {"mode": "refuse", "max_wait_s": 30.0})

    def __post_init__(self):
        for name in ("warm", "hot"):
            object.__setattr__(self, name, _level_actions(name, getattr(self, name)))
        critical = _known_keys("critical", self.critical, _CRITICAL_KEYS)
        mode = CriticalMode.lookup(critical["mode"])
        if mode is None:
            raise InputError(f"thermal actions: critical mode {critical['mode']!r} is not one of "
                             f"{', '.join(CriticalMode.values())}")
        critical["mode"] = mode
        if not _number(critical["max_wait_s"]) or critical["max_wait_s"] < 0:
            raise InputError(f"thermal actions: critical max_wait_s must be a number >= 0, got "
                             f"{critical['max_wait_s']!r}")
        object.__setattr__(self, "critical", critical)


def _known_keys(level: str, given: dict, defaults: dict) -> dict:
    if not isinstance(given, dict):
        raise InputError(f"thermal actions: {level} must be a dict, got {type(given).__name__}")
    unknown = [key for key in given if key not in defaults]
    if unknown:
        raise InputError(f"thermal actions: {level} has unknown key {unknown[0]!r} (known: {', '.join(defaults)})")
    return {**defaults, **given}


def _level_actions(level: str, given: dict) -> dict:
    acts = _known_keys(level, given, _LEVEL_KEYS)
    threads = acts["threads"]
    if threads is not None and threads != "half" and (isinstance(threads, bool) or not isinstance(threads, int)
                                                      or threads < 1):
        raise InputError(f"thermal actions: {level} threads must be an integer >= 1, 'half' or None, got {threads!r}")
    if not _number(acts["min_interval_ms"]) or acts["min_interval_ms"] < 0:
        raise InputError(f"thermal actions: {level} min_interval_ms must be a number >= 0, got "
                         f"{acts['min_interval_ms']!r}")
    if not isinstance(acts["adaptive"], bool):
        raise InputError(f"thermal actions: {level} adaptive must be true or false, got {acts['adaptive']!r}")
    if acts["prefer"] not in (None, "lower_power"):
        raise InputError(f"thermal actions: {level} prefer must be 'lower_power' or None, got {acts['prefer']!r}")
    return acts


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
