"""Validation: how an INT8 or float artifact measures up against its float reference and the ground truth, on
held-out data, and whether it passes its gate. Everything here measures; nothing builds an artifact.

- :mod:`.validate`: the driver. It streams the validation set through every artifact and writes each one's entry in
  the manifest's ``validation`` table (:func:`~.validate.validate`); it also opens an artifact as the device will
  and runs one sample, which quantize uses to check each artifact it builds.
- :mod:`.output_errors`: raw output error (cosine, max |error|), its INT8 caps and the golden tolerances a device
  checks; :mod:`.output_spread`: the dead-output check every task runs.
- :mod:`.metric_base`: what a task metric is; :mod:`.task_metrics` (what a task finds: boxes, masks, strings,
  points) and :mod:`.value_metrics` (the values it gives: regression, embeddings, raw outputs) are the agreement
  metrics, :mod:`.task_truth` the ground-truth ones (mAP, mIoU, text accuracy) with the truth a ``.npz`` may hold;
  :mod:`.metric_plugin`: a user's own metric (``quantize --metric``).

Nothing is re-exported here, so that :mod:`edgesdk_converters.calibration` can read truth arrays through
:mod:`.task_truth` without importing :mod:`.validate` (which reads calibration's ``Dataset``).
"""
