"""Tasks: what a model's outputs mean, beyond one classifier's scores.

A bundle's manifest names its task (``task``: classification, detection, segmentation, text, landmarks,
regression, probability, embedding or raw) with each output's role and the decoding parameters
(:mod:`.spec`). This package owns everything that follows from it on the device: decoding raw outputs into
detections, masks, text, points and values (:mod:`.decode` and one module per task), mapping them back to the
original image (:mod:`.geometry`), and each task's hardness signals for hybrid mode (:mod:`.hardness`). The
workstation's validation decodes with the same functions, so a gate judges what the device will show.
"""

from .results import Decoded, Detection, Landmarks, Mask, TextLine
from .spec import TaskSpec, TaskType, default_task, task_of

__all__ = ["Decoded", "Detection", "Landmarks", "Mask", "TextLine", "TaskSpec", "TaskType", "default_task",
           "task_of"]
