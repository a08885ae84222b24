"""The device runtime's core: how a bundle is loaded onto a backend and served there.

``options`` (what the app asks for: :class:`RuntimeOptions`, :class:`Budgets`), ``result`` (what a prediction
returns), ``loading`` (``load`` and the walk over the candidates), ``candidates`` (listing and ordering them),
``speed`` (the engine race and the INT8-against-FP32 pair), ``fitting`` (the memory budget), ``opening`` (opening
one candidate and checking its numerics, shared with the thermal switch), ``failure`` (the error when nothing
serves) and ``model`` (the loaded :class:`Model`). The public names are exported by :mod:`edgesdk`; this package
imports none of its modules itself, so that a module below the core (:mod:`edgesdk.hybrid.model` needs
:mod:`~edgesdk.runtime.result`) can import one without pulling in the rest.
"""
