"""Workstation side of edgesdk: a float model and calibration data in, a validated INT8 bundle out.

It owns every step before a bundle reaches a device (quantize, validation, every bundle writer); the device side
(``edgesdk``) only reads what it writes, and never imports this package except lazily from the CLI command that
needs it. The cloud side (``serve``, ``export``) lives apart.

- :mod:`.quantize` runs ``edgesdk quantize`` end to end, as asked by :mod:`.options` (``QuantizeOptions``).
- :mod:`.sources`: the source models (``.pt2``, ``.onnx``, float ``.tflite``, ``nn.Module``) and the routes each
  reaches; :mod:`.onnx_prepare` readies an ONNX model from the wild for a route, :mod:`.onnx_import` turns ONNX into
  torch for litert-torch, :mod:`.tflite_model` reads and edits ``.tflite`` flatbuffers.
- :mod:`.targets`: one builder per engine (LiteRT, OpenVINO, ONNX Runtime), each writing a float reference and an
  INT8 artifact; :mod:`.toolchain_output` keeps the toolchains' chatter off the terminal.
- :mod:`.calibration`: calibration and validation data in every accepted form, as one ``Dataset``.
- :mod:`.task_choice`: which task a run records.
- :mod:`.validation`: each artifact measured against its float reference and the ground truth, and gated.
- :mod:`.recovery`: an INT8 artifact that fails its gate quantized again with its worst layers in float.
- :mod:`.layers`: layer-by-layer INT8 error per engine (``edgesdk debug``, and recovery's ranking).
- Bundle writing: :mod:`.manifest` (what the manifest says), :mod:`.monitoring` (its reference statistics for the
  device's drift signals), :mod:`.bundle_writer` (file entries and the manifest file).
- :mod:`.escalation`: ``edgesdk calibrate-escalation``, the hybrid-mode threshold from labelled data.
- :mod:`.cli`: the workstation's ``edgesdk`` commands; :mod:`.demo`: ``edgesdk demo`` on the samples.
"""
