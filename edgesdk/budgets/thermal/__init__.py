"""The thermal budget: how hot the device is (:mod:`.sensors`) and what the next inference does about it
(:mod:`.governor`); how a loaded model carries that out is the runtime's (:mod:`edgesdk.runtime.thermal_serving`).

Sensors (anything with ``read() -> ThermalReading``): :class:`LinuxThermalZones` (sysfs, with a configurable
root), :class:`EdgeTpuTemperature` (a Coral's own sensor), :class:`RaspberryPiThrottled` (``vcgencmd
get_throttled``) and :class:`PushedThermalState` (what the host app pushes from Android or Apple APIs).
:class:`ThermalGovernor` turns readings into a level (:data:`LEVELS`) and a level into an action
(:class:`ThermalActions`): fewer threads, pacing, a lower-power backend, and at critical refuse, defer or escalate.
"""

from .governor import CRITICAL_MODES, Plan, ThermalActions, ThermalGovernor
from .sensors import (LEVELS, EdgeTpuTemperature, LinuxThermalZones, PushedThermalState, RaspberryPiThrottled,
                      ThermalReading, ThermalSensor)

__all__ = ["LEVELS", "ThermalReading", "ThermalSensor", "LinuxThermalZones", "EdgeTpuTemperature",
           "RaspberryPiThrottled", "PushedThermalState", "ThermalActions", "ThermalGovernor", "Plan",
           "CRITICAL_MODES"]
