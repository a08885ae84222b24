"""The device runtime's core: how a bundle is loaded onto a backend and served there.

``options`` (what the app asks for: :class:`RuntimeOptions`, :class:`Budgets`), ``loading`` (``load`` and the walk
over the candidates), ``candidates`` (listing and ordering them, and ``policy="autotune"``), ``speed`` and
``precision_choice`` (the engine race and the INT8-against-FP32 pair), ``autotune`` (the machine and cache keys the
timing decisions are kept under, and failed probes), ``timing`` (the one timing loop: autotune, the speed checks and
``edgesdk bench``), ``fitting`` (the memory budget), ``opening`` (opening one candidate and checking its numerics,
shared with the thermal switch), ``failure`` (the error when nothing serves), ``model`` (the loaded :class:`Model`),
``thermal_serving`` (how a loaded model carries out the thermal governor's plan) and ``pool``
(:class:`~edgesdk.ModelPool`: several models under one memory budget). What a prediction returns,
:class:`~edgesdk.Result`, is :mod:`edgesdk.result`'s, below both this package and :mod:`edgesdk.hybrid`. This package
sits above :mod:`edgesdk.budgets`, :mod:`edgesdk.hybrid`, :mod:`edgesdk.trust` and :mod:`edgesdk.monitor`, and
none of them imports it. The public names are exported by :mod:`edgesdk`; this package imports none of its modules
itself.
"""
