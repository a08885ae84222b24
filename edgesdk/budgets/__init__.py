"""The device's budgets: how much memory a model may take and how hot the device may get.

``memory`` (a model's resident cost, measured or estimated, against ``Budgets(memory_mb=...)``) and ``thermal``
(sensors and the governor that decides what the next inference does; with a simulated device for machines without a
sensor). The runtime, above this package, acts on them: :mod:`edgesdk.runtime.fitting` and
:mod:`edgesdk.runtime.pool` (:class:`~edgesdk.ModelPool`) keep models within the memory budget,
:mod:`edgesdk.runtime.thermal_serving` carries out the governor's plan. This package imports no runtime module. The
public names are exported by :mod:`edgesdk`; this package imports none of its modules itself.
"""
