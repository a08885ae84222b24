"""edgesdk: on-device inference with INT8 bundles for LiteRT, OpenVINO and ONNX Runtime.

This package is the device side: it imports numpy, Pillow and whichever engine is
installed, never torch, nncf, litert-torch or the workstation converters.
"""

from .bundle.reader import Artifact, Bundle
from .choices import (BackendReason, BudgetReason, CloudReason, EscalationReason, HybridMode, Performance, Policy,
                      SpeedCheck)
from .errors import (BackendUnavailable, BudgetExceeded, BundleError, CalibrationError, CloudError, CloudRejected,
                     CloudTimeout, CloudUnavailable, ConversionError, EdgeSDKError, FailedArtifactWarning, InputError,
                     TargetsFailed, ValidationFailed)
from .hybrid.model import EscalationPolicy, HybridModel, HybridOptions
from .bundle.tensors import Top
from .runtime.loading import load
from .runtime.model import Model
from .runtime.options import Budgets, RuntimeOptions
from .runtime.result import Result
from .runtime.placement import Placement
from .budgets.pool import ModelPool
from .bundle.preprocess import Preprocess
from .trust import Trust

from .version import __version__

__all__ = [
    "load", "ModelPool", "Budgets", "Model", "Result", "Top", "RuntimeOptions", "Placement", "Artifact", "Bundle",
    "Preprocess", "HybridOptions", "EscalationPolicy", "HybridModel", "Trust",
    "Policy", "Performance", "SpeedCheck", "HybridMode", "BackendReason", "BudgetReason", "CloudReason",
    "EscalationReason",
    "EdgeSDKError", "BundleError", "InputError", "BackendUnavailable", "BudgetExceeded", "ConversionError",
    "CalibrationError", "TargetsFailed", "ValidationFailed", "CloudError", "CloudTimeout", "CloudUnavailable", "CloudRejected",
    "FailedArtifactWarning",
    "__version__",
]
