"""Hybrid mode under injected network faults: is any request lost, late, or retried past the budget?

    python benchmarks/hybrid_faults.py [--requests 1000] [--fault-rate 0.3] [--seed 7] [--deadline-s 0.5] \
        [--interval-s 0] [--proxy-nagle]

A real ``edgesdk serve`` of the digits bundle (started from the cloud venv, as in the tests:
``tests/cloud_server.py``) behind a fault-injecting proxy on loopback (``tests/fault_proxy.py``): at the fault
rate a request is delayed past the client's attempt timeout, reset (TCP RST), or answered 429 or 503. The app
side is ``edgesdk.load(bundle, mode="prefer-device", cloud=client, escalation=EscalationPolicy(threshold=1.0))``,
so every input is "hard" and asks the cloud; when the cloud fails the device answers, marked degraded. The client
is configured as in ``tests/cloud/test_hybrid_cloud.py::test_no_request_is_lost_at_a_30_percent_fault_rate``.

Three phases, each with a fresh client (its stats are the phase's) in one run:

- baseline: the same path with a fault rate of 0, for the cloud latency without faults;
- faults: ``--requests`` requests at ``--fault-rate``, back to back as in the test or one every ``--interval-s``
  (the breaker's cool-down is a time: back to back, a thousand fail-fast answers fit in it): answers by source
  (cloud, or device with the cloud's failure reason), lost requests (``predict`` raised or gave no output),
  latency per source, the share within deadline + margin, the faults the proxy injected, attempts, retries
  against the retry budget, the breaker's state changes, openings and recoveries;
- outage: after a warm-up the proxy resets every request for ``--outage-requests`` requests (one every
  ``--outage-interval-s``, so the cool-down passes during the outage and its probes fail), then the network
  recovers (fault rate 0): time and requests until the breaker opens, the latency of the fail-fast
  (``circuit_open``) answers, time and requests until it is closed again.

"Within deadline + margin" is the wall time of the whole ``predict`` (preprocessing, the device's inference, every
cloud call it makes) against the client's ``deadline_s`` plus ``--margin-s``. Nothing is asserted; the exit code is
0 unless the script itself fails.

The proxy's sockets get ``TCP_NODELAY`` (as in the tests; ``--proxy-nagle`` turns Nagle's algorithm back on to
see its cost): the proxy sends a response's headers and body in two writes, so with Nagle each forwarded
response and each injected 429/503 waits for the client's delayed ACK, about 40 ms on loopback (cloud p50 44 ms
instead of 2 ms).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from bundles import digits_bundle  # noqa: E402

# As in the test: a retry budget of 20% of the calls plus 10; the client's default breaker (half of the last 50
# calls failed, after at least 20).
BUDGET = {"ratio": 0.2, "reserve": 10}
BREAKER = {"failure_rate": 0.5, "window": 50, "min_calls": 20}
WARMUP = 20  # fault-free requests before the outage: the model check is done and the breaker is closed


class Run:
    """One phase's requests: what answered, how long each took, what was lost."""

    def __init__(self, name: str):
        self.name = name
        self.rows: list[tuple[str, float]] = []  # (group, seconds) per answered request
        self.calls: list[int] = []  # cloud calls (model check, server metadata, infer) per answered request
        self.lost: list[str] = []

    def predict(self, model, x) -> object | None:
        calls = model.cloud.stats()["calls"]
        t0 = time.perf_counter()
        try:
            result = model.predict(x)
        except Exception as exc:  # a lost request is counted, never fatal
            self.lost.append(f"{type(exc).__name__}: {exc}"[:200])
            return None
        seconds = time.perf_counter() - t0
        if not result.outputs or result.outputs[0].size == 0:
            self.lost.append("a result without outputs")
            return None
        self.rows.append((group(result), seconds))
        self.calls.append(model.cloud.stats()["calls"] - calls)
        return result

    def seconds(self, prefix: str = "") -> np.ndarray:
        return np.array([s for g, s in self.rows if g.startswith(prefix)])


def group(result) -> str:
    if result.source == "cloud":
        return "cloud"
    if result.degraded:
        return f"device, degraded: {result.cloud_error}"
    return f"device (not escalated: {result.escalation_reason})"


def make_proxy(server, args, **kw):
    """The tests' fault proxy, with Nagle's algorithm off on its sockets unless ``--proxy-nagle``: the proxy writes
    a response's headers and body in two sends, so with Nagle on each forwarded response (and each injected
    429/503) waits for the client's delayed ACK, about 40 ms on Linux loopback, which is no part of a fault."""
    from fault_proxy import FaultProxy

    proxy = FaultProxy(server.url, seed=args.seed, **kw)
    proxy.server.RequestHandlerClass.disable_nagle_algorithm = not args.proxy_nagle
    return proxy


def make_client(url: str, model: str, args):
    from edgesdk.hybrid.client import CircuitBreaker, CloudClient, RetryBudget

    return CloudClient(url, model, timeout_s=args.timeout_s, deadline_s=args.deadline_s, max_attempts=3,
                       backoff_base_s=0.02, backoff_cap_s=0.1, retry_budget=RetryBudget(**BUDGET),
                       breaker=CircuitBreaker(**BREAKER, cooldown_s=args.cooldown_s))


def load(bundle: Path, client):
    import edgesdk

    return edgesdk.load(bundle, require="onnxruntime", mode="prefer-device", cloud=client,
                        escalation=edgesdk.EscalationPolicy(threshold=1.0))


def ms(values: np.ndarray, q: float | None = None, digits: int = 1) -> str:
    if values.size == 0:
        return "-"
    return f"{(values.max() if q is None else np.percentile(values, q)) * 1e3:.{digits}f}"


def table(run: Run, limit_s: float) -> None:
    groups = Counter(g for g, _ in run.rows)
    print(f"  {'answered by':<34} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'in limit':>9}")
    for name in sorted(groups, key=lambda g: (g != "cloud", g)):
        s = np.array([t for g, t in run.rows if g == name])
        share = 100.0 * np.count_nonzero(s <= limit_s) / s.size
        print(f"  {name:<34} {s.size:>5} {ms(s, 50):>8} {ms(s, 95):>8} {ms(s, 99):>8} {ms(s):>8} {share:>8.1f}%")
    print(f"  {'lost':<34} {len(run.lost):>5}")


def budget_line(stats: dict) -> str:
    """Retries against the budget: every call that was sent deposits ``ratio`` (a call failed fast by the open
    circuit deposits nothing), and the budget starts full at ``reserve``."""
    sent = stats["calls"] - stats["failures"].get("circuit_open", 0)
    limit = BUDGET["ratio"] * sent + BUDGET["reserve"]
    ok = "<=" if stats["retries"] <= limit else "> (OVER)"
    return (f"retries {stats['retries']} {ok} budget {limit:.0f} ({BUDGET['ratio']:g} x {sent} calls sent + "
            f"{BUDGET['reserve']}); {stats['retries'] / max(1, sent):.3f} retries per call sent, "
            f"{stats['retries_refused']} refused")


def client_line(stats: dict) -> str:
    failures = ", ".join(f"{k} {v}" for k, v in sorted(stats["failures"].items())) or "none"
    return (f"  client: {stats['calls']} calls, {stats['attempts']} attempts, {stats['ok']} ok; failures: {failures}; "
            f"breaker {stats['breaker']}, opened {stats['breaker_opened']}, recovered {stats['breaker_recovered']}")


def progress(phase: str, i: int, total: int, t0: float) -> None:
    if (i + 1) % 200 == 0 or i + 1 == total:
        print(f"  [{phase}] {i + 1}/{total} requests, {time.perf_counter() - t0:.1f} s", flush=True)


def baseline(server, bundle: Path, inputs: np.ndarray, args) -> Run:
    run = Run("baseline")
    with make_proxy(server, args, fault_rate=0.0) as proxy, \
            make_client(proxy.url, server.model, args) as client, load(bundle, client) as model:
        model.predict(inputs[0][None])  # the model check and the first connection are not the baseline
        t0 = time.perf_counter()
        for i in range(args.baseline_requests):
            run.predict(model, inputs[i % len(inputs)][None])
            progress("baseline", i, args.baseline_requests, t0)
        device = Run("device-only")
        for i in range(100):
            t = time.perf_counter()
            model.predict(inputs[i % len(inputs)][None], mode="device-only")
            device.rows.append(("device", time.perf_counter() - t))
    print(f"\nbaseline: fault rate 0, {args.baseline_requests} requests through the proxy "
          f"(for reference, the device alone: p50 {ms(device.seconds(), 50, 3)} ms)")
    table(run, args.deadline_s + args.margin_s)
    return run


def faults(server, bundle: Path, inputs: np.ndarray, args) -> tuple[Run, dict, Counter]:
    run = Run("faults")
    limit_s = args.deadline_s + args.margin_s
    slowest: list[tuple[float, int, str]] = []
    extra: list[tuple[int, int]] = []  # (request, cloud calls) where one predict made several calls
    changes: list[tuple[int, float, str]] = []  # the breaker's state changes: (after request, seconds, state)
    with make_proxy(server, args, fault_rate=args.fault_rate, delay_s=args.delay_s) as proxy, \
            make_client(proxy.url, server.model, args) as client, load(bundle, client) as model:
        state = client.breaker.state
        t0 = time.perf_counter()
        for i in range(args.requests):
            result = run.predict(model, inputs[i % len(inputs)][None])
            if result is not None:
                slowest.append((run.rows[-1][1], i, run.rows[-1][0]))
                if run.calls[-1] > 1:
                    extra.append((i, run.calls[-1]))
            if client.breaker.state != state:
                state = client.breaker.state
                changes.append((i, time.perf_counter() - t0, state))
            progress("faults", i, args.requests, t0)
            if args.interval_s:
                time.sleep(args.interval_s)
        elapsed = time.perf_counter() - t0
        stats, counts = client.stats(), Counter(proxy.counts)
    injected = ", ".join(f"{k} {counts[k]}" for k in ("delay", "reset", "429", "503"))
    pacing = f"one every {args.interval_s * 1e3:g} ms" if args.interval_s else "back to back"
    print(f"\nfaults: {args.requests} requests ({pacing}, {elapsed:.1f} s) at fault rate {args.fault_rate:g} "
          f"(seed {args.seed}); proxy saw {counts['requests']} requests, forwarded {counts['forwarded']}, "
          f"injected {injected}")
    table(run, limit_s)
    print(client_line(stats))
    print(f"  {budget_line(stats)}")
    if changes:
        shown = "; ".join(f"{s} after #{i} ({t:.2f} s)" for i, t, s in changes[:8])
        print(f"  breaker: {shown}{' ...' if len(changes) > 8 else ''}; at the end: {state}")
    if extra:
        print(f"  {len(extra)} request(s) made more than one cloud call (the model check and the server metadata "
              f"come before the first infer and are asked again after a failure): "
              + ", ".join(f"#{i} {c} calls" for i, c in extra[:10]))
    late = sorted(slowest, reverse=True)[:5]
    print("  slowest: " + "; ".join(f"#{i} {s * 1e3:.0f} ms ({g})" for s, i, g in late))
    over = [(s, i) for s, i, _ in slowest if s > args.deadline_s]
    if over:
        print(f"  {len(over)} request(s) took longer than the deadline itself ({args.deadline_s:g} s): "
              + ", ".join(f"#{i} {s * 1e3:.0f} ms" for s, i in sorted(over, key=lambda o: o[1])[:10]))
    return run, stats, counts


def outage(server, bundle: Path, inputs: np.ndarray, args) -> dict:
    run = Run("outage")
    x = inputs[0][None]
    out: dict = {}
    with make_proxy(server, args, fault_rate=0.0) as proxy, \
            make_client(proxy.url, server.model, args) as client, load(bundle, client) as model:
        for _ in range(WARMUP):
            model.predict(x)
        proxy.outage = True
        t0 = time.perf_counter()
        opened_after = None
        for i in range(args.outage_requests):
            run.predict(model, x)
            if opened_after is None and client.breaker.state != "closed":
                opened_after = (i + 1, time.perf_counter() - t0)
            time.sleep(args.outage_interval_s)
        stats_during = client.stats()
        proxy.outage, proxy.fault_rate = False, 0.0
        t1 = time.perf_counter()
        recovered_after, after = None, Run("after")
        give_up = t1 + max(5.0, 10 * args.cooldown_s)
        n = 0
        while time.perf_counter() < give_up:
            result = after.predict(model, x)
            n += 1
            if result is not None and result.source == "cloud" and client.breaker.state == "closed":
                recovered_after = (n, time.perf_counter() - t1)
                break
            time.sleep(args.outage_interval_s)
        confirm = Run("confirm")
        for _ in range(20):
            confirm.predict(model, x)
        stats = client.stats()
    print(f"\noutage: every request reset for {args.outage_requests} requests (one every "
          f"{args.outage_interval_s * 1e3:g} ms, {t1 - t0:.2f} s), then fault rate 0; cool-down {args.cooldown_s:g} s")
    table(run, args.deadline_s + args.margin_s)
    if opened_after:
        print(f"  breaker opened after {opened_after[0]} requests, {opened_after[1] * 1e3:.0f} ms into the outage; "
              f"opened {stats_during['breaker_opened']} times during it (each failed probe reopens it)")
    else:
        print("  the breaker did NOT open during the outage")
    fast = run.seconds("device, degraded: circuit_open")
    slow = np.array([s for g, s in run.rows if g.startswith("device, degraded:") and not g.endswith("circuit_open")])
    print(f"  fail fast: {fast.size} circuit_open answers, p50 {ms(fast, 50)} ms, max {ms(fast)} ms; the "
          f"{slow.size} calls that were sent and failed: p50 {ms(slow, 50)} ms, max {ms(slow)} ms")
    if recovered_after:
        print(f"  after the network came back: closed again at request {recovered_after[0]}, "
              f"{recovered_after[1] * 1e3:.0f} ms later ({sum(g != 'cloud' for g, _ in after.rows)} answered by the "
              f"device meanwhile); next 20: {sum(g == 'cloud' for g, _ in confirm.rows)} from the cloud")
    else:
        print(f"  the breaker did NOT close within {give_up - t1:.1f} s after the network came back "
              f"(state {stats['breaker']})")
    print(client_line(stats))
    out.update(stats=stats, run=run, after=after, confirm=confirm, opened_after=opened_after,
               recovered_after=recovered_after)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, help="the digits bundle (default: build/demo/digits.bundle)")
    ap.add_argument("--requests", type=int, default=1000, help="requests in the faults phase")
    ap.add_argument("--fault-rate", type=float, default=0.3, help="share of proxied requests given a fault")
    ap.add_argument("--seed", type=int, default=7, help="the proxy's fault draw")
    ap.add_argument("--interval-s", type=float, default=0.0,
                    help="pause between requests in the faults phase (0: back to back, as the test)")
    ap.add_argument("--deadline-s", type=float, default=0.5, help="the client's deadline per call")
    ap.add_argument("--margin-s", type=float, default=0.25, help="allowed past the deadline, per predict")
    ap.add_argument("--timeout-s", type=float, default=0.15, help="the client's timeout per attempt")
    ap.add_argument("--delay-s", type=float, default=0.3, help="how long a 'delay' fault holds a request")
    ap.add_argument("--cooldown-s", type=float, default=0.5, help="the breaker's cool-down")
    ap.add_argument("--proxy-nagle", action="store_true",
                    help="turn Nagle's algorithm back on in the proxy (+~40 ms per response)")
    ap.add_argument("--baseline-requests", type=int, default=300)
    ap.add_argument("--outage-requests", type=int, default=200)
    ap.add_argument("--outage-interval-s", type=float, default=0.01, help="pause between outage requests")
    args = ap.parse_args()

    from edgesdk import Bundle

    from cloud_server import CloudServer

    bundle = digits_bundle(args.bundle).resolve()  # the server runs in its log directory
    inputs = Bundle.open(bundle).golden()["input_0"]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgesdk-faults-") as logs:
        print(f"starting edgesdk serve {bundle} (cloud venv) ...", flush=True)
        try:
            server = CloudServer(bundle, log_dir=Path(logs)).__enter__()
        except BaseException as exc:  # CloudServer reports through pytest.fail (an OutcomeException)
            sys.exit(f"could not start the server: {exc}")
        try:
            print(f"server at {server.url} (ready in {time.perf_counter() - started:.1f} s); {len(inputs)} golden "
                  f"inputs; deadline {args.deadline_s:g} s + margin {args.margin_s:g} s, attempt timeout "
                  f"{args.timeout_s:g} s, 3 attempts, retry budget {BUDGET}, breaker {BREAKER}", flush=True)
            base = baseline(server, bundle, inputs, args)
            run, stats, counts = faults(server, bundle, inputs, args)
            down = outage(server, bundle, inputs, args)
        finally:
            server.stop()

    limit_s = args.deadline_s + args.margin_s
    answered = np.array([s for _, s in run.rows])
    within = 100.0 * np.count_nonzero(answered <= limit_s) / args.requests
    cloud, base_cloud = run.seconds("cloud"), base.seconds("cloud")
    lost_all = len(run.lost) + len(down["run"].lost) + len(down["after"].lost) + len(down["confirm"].lost)
    print(f"\nsummary (faults phase unless said; {time.perf_counter() - started:.0f} s in all)")
    print(f"  lost: {len(run.lost)} (required 0); in the outage phase: {lost_all - len(run.lost)}")
    for reason in sorted(set(run.lost + down["run"].lost))[:5]:
        print(f"    lost because: {reason}")
    print(f"  within deadline+margin ({limit_s:g} s): {within:.1f}% (required 100%); slowest {ms(answered)} ms")
    print(f"  {budget_line(stats)}")
    print(f"  breaker opened {stats['breaker_opened']} times, recovered {stats['breaker_recovered']} times "
          f"(outage phase: opened {down['stats']['breaker_opened']}, recovered {down['stats']['breaker_recovered']}, "
          f"closed again: {'yes' if down['recovered_after'] else 'NO'})")
    print(f"  cloud answers: {cloud.size}/{args.requests}; cloud p50/p95 {ms(cloud, 50)}/{ms(cloud, 95)} ms with "
          f"faults vs {ms(base_cloud, 50)}/{ms(base_cloud, 95)} ms without (baseline)")


if __name__ == "__main__":
    main()
