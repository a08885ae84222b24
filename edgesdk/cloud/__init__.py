"""Hybrid mode across the network, on the device: the V2 client the device calls (:mod:`edgesdk.cloud.client`)
and which artifact a cloud server serves by default (:mod:`edgesdk.cloud.served_artifact`, read from the bundle).

The server and the deployment exporter are the cloud side, a package of their own (:mod:`edgesdk_cloud`:
``edgesdk serve``, ``edgesdk export``), which this package never imports.
"""
