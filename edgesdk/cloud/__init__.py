"""Hybrid mode across the network: the V2 client the device calls (:mod:`edgesdk.cloud.client`) and the
server that hosts a bundle in the cloud (:mod:`edgesdk.cloud.server`, ``edgesdk serve``).

Importing this package imports neither side: the server needs ``kserve`` (``pip install 'edgesdk[cloud]'``),
which never goes on the device.
"""
