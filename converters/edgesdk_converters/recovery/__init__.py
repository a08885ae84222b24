"""Accuracy recovery (``quantize --recover``): an INT8 artifact that fails its validation gate is quantized again,
first with the engine's other range choice, then with its most sensitive layers kept in float, the fewest that make
it pass, within a time budget shared by the run. The result is recorded in the artifact's manifest entry
(``recovery``).

- :mod:`.recover`: the trials on each engine (ranking layers by :mod:`edgesdk_converters.layers`, re-quantizing by
  the target builders, recording what was kept and why); :func:`recover_bundle` is what quantize calls.
- :mod:`.search`: which layers to keep and in what order to try them; it knows no engine, only the trial it is given.
- :mod:`.budget`: how long recovery may take (:class:`~.budget.Budget`, :func:`~.budget.default_budget`).

Recovery does not import validation: quantize hands it ``check``, the validation entry of a candidate artifact.
"""

from .recover import MODES, recover_bundle

__all__ = ["MODES", "recover_bundle"]
