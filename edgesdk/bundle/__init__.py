"""Reading a bundle on the device: the folder or ``.edgebundle`` a quantize run wrote, checked before anything uses it.

``schema`` (the manifest's format and every check on it), ``reader`` (:class:`~edgesdk.Bundle` and its
:class:`~edgesdk.Artifact` entries: paths confined to the bundle, checksums, the golden data), ``external_data``
(an ONNX model's external tensor files, held against the manifest before an engine opens them; read by
:mod:`edgesdk.engines.model_files`), ``preprocess`` (what the manifest says an input becomes: resize, layout,
normalization), ``tensors`` (what an app hands a model made into input tensors, and
output tensors made into top-k classes) and ``report`` (the manifest rendered as text for ``inspect``). Writing a
bundle is the workstation's (:mod:`edgesdk_converters.bundle_writer`); this package only reads. It sits above
:mod:`edgesdk.engines` (an :class:`~edgesdk.Artifact` opens one), which never imports it. The public names are
exported by :mod:`edgesdk`; this package imports none of its modules itself.
"""
