"""The device's budgets: how much memory a model may take and how hot the device may get.

``memory`` (a model's resident cost, measured or estimated, against ``Budgets(memory_mb=...)``), ``pool``
(:class:`~edgesdk.ModelPool`: several models under one memory budget, least recently used evicted first) and
``thermal`` (sensors, the governor that decides what the next inference does, and the serving side that carries
it out; with a simulated device for machines without a sensor). The public names are exported by :mod:`edgesdk`;
this package imports none of its modules itself.
"""
