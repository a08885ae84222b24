"""edgesdk: on-device inference with INT8 bundles for LiteRT, OpenVINO and ONNX Runtime.

This package is the device side: it imports numpy, Pillow and whichever engine is
installed, never torch, nncf, litert-torch or the workstation converters.
"""

from .bundle.reader import Artifact, Bundle
from .choices import (BackendReason, BudgetReason, CloudReason, EscalationReason, HybridMode, InstallStep,
                      Performance, Policy, SpeedCheck, StoreReason, VersionState)
from .errors import (BackendUnavailable, BudgetExceeded, BundleError, CalibrationError, CloudError, CloudRejected,
                     CloudTimeout, CloudUnavailable, ConversionError, EdgeSDKError, FailedArtifactWarning, InputError,
                     StoreError, TargetsFailed, ValidationFailed)
from .hybrid.model import EscalationPolicy, HybridModel, HybridOptions
from .bundle.tensors import Top
from .runtime.loading import load
from .runtime.model import Model
from .runtime.options import Budgets, RuntimeOptions
from .result import Result
from .runtime.placement import Placement
from .runtime.pool import ModelPool
from .bundle.preprocess import Preprocess
from .trust import Trust
from .store import BundleStore, Probation, StoreOptions, StoreVersion

from .version import __version__

__all__ = [
    "load", "ModelPool", "Budgets", "Model", "Result", "Top", "RuntimeOptions", "Placement", "Artifact", "Bundle",
    "Preprocess", "HybridOptions", "EscalationPolicy", "HybridModel", "Trust",
    "BundleStore", "StoreOptions", "Probation", "StoreVersion",
    "Policy", "Performance", "SpeedCheck", "HybridMode", "BackendReason", "BudgetReason", "CloudReason",
    "EscalationReason", "StoreReason", "VersionState", "InstallStep",
    "EdgeSDKError", "BundleError", "InputError", "BackendUnavailable", "BudgetExceeded", "ConversionError",
    "CalibrationError", "TargetsFailed", "ValidationFailed", "StoreError", "CloudError", "CloudTimeout",
    "CloudUnavailable", "CloudRejected",
    "FailedArtifactWarning",
    "__version__",
]
