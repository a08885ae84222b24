"""On-device monitoring: what each loaded model sees and does, drift against the data it was calibrated on, and
alerts, without ever keeping an input.

- :mod:`.summaries`: the few numbers kept per prediction (per input channel and grid cell; the task's output
  summary), the same at quantize time and on the device;
- :mod:`.drift`: fixed bins, PSI and Jensen-Shannon against the bundle's reference;
- :mod:`.reference`: the reference section quantize writes into the manifest;
- :mod:`.monitor`: :class:`Monitor` (``model.monitor``): rolling windows, signals, alert levels with hysteresis,
  hooks, bounded responses, ``snapshot()``;
- :mod:`.sink`: the JSON-lines file sink; :mod:`.otel`: publishing through the OpenTelemetry metrics API (the
  ``edgesdk[otel]`` extra).

Nothing here sends anything anywhere: a sink or an exporter is the app's choice.
"""

from .monitor import Alert, Monitor, MonitorOptions

__all__ = ["Alert", "Monitor", "MonitorOptions"]
