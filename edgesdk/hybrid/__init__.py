"""Hybrid mode on the device: hard inputs escalated to a cloud model over the Open Inference Protocol (KServe V2).

``model`` (:class:`~edgesdk.HybridModel`, :class:`~edgesdk.HybridOptions`, :class:`~edgesdk.EscalationPolicy`:
when to escalate and how a failed cloud call falls back to the device answer), ``client`` (the V2 client, standard
library only, with a deadline per prediction), ``transport`` (how the client reaches a server: the injectable
:class:`~edgesdk.hybrid.transport.Transport`, its HTTP default, and :class:`~edgesdk.hybrid.transport.MockTransport`
for tests without sockets), ``v2_codec`` (V2 requests and answers as bytes), ``resilience`` (retry budget and circuit
breaker) and ``served_artifact`` (which artifact a cloud server serves by default, read from the bundle). The server
and the deployment exporter are the cloud side, a package of their own (:mod:`edgesdk_cloud`), which this package
never imports. The public names are exported by :mod:`edgesdk`; this package imports none of its modules itself.
"""
