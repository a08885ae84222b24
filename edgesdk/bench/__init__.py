"""``edgesdk bench``: how fast a bundle runs here, per backend, warm (``warm``: latency percentiles, throughput,
memory, each backend in its own child process when asked) and cold (``cold``: a fresh process from import to first
answer). Not imported by the runtime; the CLI imports it when the command runs.
"""
