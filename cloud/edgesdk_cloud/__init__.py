"""Cloud side of edgesdk: what runs a bundle off the device, for hybrid mode to escalate to.

It owns ``edgesdk serve`` (:mod:`edgesdk_cloud.server`: a bundle's model in KServe's ModelServer, over the Open
Inference Protocol V2 REST) and ``edgesdk export kserve|triton`` (:mod:`edgesdk_cloud.export`: a KServe predictor
image and InferenceService, or a Triton model repository, written into a folder). It imports the device package
(``edgesdk``: bundle reading, engines, the V2 datatype table of :mod:`edgesdk.hybrid.client`, the default served
artifact of :mod:`edgesdk.hybrid.served_artifact`), never the workstation (``edgesdk_converters``), and the device
package never imports it, except lazily from the ``edgesdk`` command that needs it. ``kserve`` (the ``cloud``
extra) is imported only when a server starts: exporting needs nothing beyond edgesdk.
"""
