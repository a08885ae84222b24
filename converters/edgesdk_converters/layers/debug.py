"""``edgesdk debug``: each INT8 artifact of a bundle against its engine's float artifact, layer by layer, named by
the source model so that the engines' reports line up.

The inputs are the bundle's golden inputs (the first validation samples, stored in every bundle) or a dataset
(``--val``). The source's names come from the golden float artifact (:mod:`.align`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from edgesdk.errors import ConversionError, InputError

from . import Layer, probe_for
from .align import align
from .compare import LayerError, compare, worst

GOLDEN_ORDER = ("onnxruntime-fp32", "openvino-fp32", "litert-fp32")
DEFAULT_SAMPLES = 4


@dataclass
class EngineReport:
    """One INT8 artifact's layers (``rows``, in the artifact's order) against its float reference."""

    artifact: str
    engine: str
    reference: str
    rows: list[LayerError]
    seconds: float
    unmatched: int = 0  # layers the source's names could not be found for

    def as_dict(self, top: int | None = None) -> dict:
        ranked = worst(self.rows)
        total = sum(r.macs for r in self.rows) or 0
        return {"artifact": self.artifact, "engine": self.engine, "reference": self.reference,
                "layers": len(self.rows), "unmatched_layers": self.unmatched, "macs": total,
                "int8_macs": sum(r.macs for r in self.rows if r.quantized), "seconds": round(self.seconds, 2),
                "worst": [r.as_dict() for r in (ranked if top is None else ranked[:top])],
                "along": [r.as_dict() for r in self.rows]}


@dataclass
class DebugReport:
    bundle: str
    source_reference: str
    samples: int
    engines: list[EngineReport] = field(default_factory=list)
    source_order: dict[str, int] = field(default_factory=dict)  # source tensor name -> its place in the source

    def as_dict(self, top: int | None = None) -> dict:
        return {"bundle": self.bundle, "source_reference": self.source_reference, "samples": self.samples,
                "artifacts": [e.as_dict(top) for e in self.engines]}


def debug_bundle(bundle_path: str | Path, artifacts: list[str] | None = None, data: Any = None,
                 samples: int = DEFAULT_SAMPLES, say: Callable[[str], None] = lambda s: None,
                 progress: Callable[[str], Callable[[Iterable], Iterable]] = lambda desc: iter) -> DebugReport:
    """Compare every INT8 artifact of the bundle (or those named in ``artifacts``) with its float reference."""
    from edgesdk.bundle.reader import Bundle

    bundle = Bundle.open(bundle_path)
    by_id = {a.id: a for a in bundle.artifacts}
    int8 = [a for a in bundle.artifacts if a.precision == "int8"]
    if artifacts:
        unknown = [a for a in artifacts if a not in by_id]
        if unknown:
            raise ConversionError(f"bundle {bundle.name!r} has no artifact {', '.join(map(repr, unknown))} "
                                  f"(artifacts: {', '.join(by_id)})")
        not_int8 = [a for a in artifacts if by_id[a].precision != "int8"]
        if not_int8:
            raise ConversionError(f"{', '.join(not_int8)} is not an INT8 artifact: debug compares an INT8 artifact "
                                  f"with its float reference (INT8 artifacts: {', '.join(a.id for a in int8) or 'none'})")
        int8 = [by_id[a] for a in artifacts]
    if not int8:
        raise ConversionError(f"bundle {bundle.name!r} has no INT8 artifact to debug")
    feeds = _samples(bundle, data, samples)
    golden_id = next((i for i in GOLDEN_ORDER if i in by_id), None)
    if golden_id is None:
        raise ConversionError(f"bundle {bundle.name!r} has no float artifact to name layers by")
    golden = by_id[golden_id]
    report = DebugReport(str(bundle_path), golden_id, len(feeds))
    with SourceModel(golden, feeds[0]) as source:
        report.source_order = {l.name: k for k, l in enumerate(source.layers)}
        for art in int8:
            ref_id = art.entry.get("reference") or f"{art.engine}-fp32"
            ref = by_id.get(ref_id) or next((a for a in bundle.artifacts if a.engine == art.engine
                                             and a.precision == "fp32"), None)
            if ref is None:
                raise ConversionError(f"{art.id} has no float artifact of its engine in the bundle to compare with")
            say(f"[{art.id}] against {ref.id}, {len(feeds)} samples")
            started = time.perf_counter()
            rows, _ = layer_errors(art, ref, feeds, source, progress(f"[{art.id}] layers"))
            unmatched = sum(1 for r in rows if r.source is None)
            report.engines.append(EngineReport(art.id, art.engine, ref.id, rows, time.perf_counter() - started,
                                               unmatched))
    return report


def layer_errors(int8, ref, samples: list[list[np.ndarray]], source: "SourceModel | None" = None,
                 progress: Callable[[Iterable], Iterable] = iter) -> tuple[list[LayerError], list[Layer]]:
    """``int8`` against its float reference ``ref`` (bundle artifacts or freshly built ones: ``engine``, ``files``,
    ``runtime``) layer by layer on ``samples``: the rows of :func:`~.compare.compare`, named by ``source`` (None: the
    engine's own names), and every layer of ``int8`` with its MACs at the samples' shapes."""
    shared = source is not None and ref.id == source.artifact.id
    with _Opened(ref, source if shared else None) as fp, _Opened(int8) as q:
        names = source.names(fp.probe, shared) if source is not None else (lambda layer: None)
        rows = compare(fp.probe, q.probe, samples, names, progress=progress)
        return rows, q.probe.layers()


class SourceModel:
    """The golden float artifact opened once, its layers and their values on one sample: what names every other
    artifact's layers (:class:`SourceNames`)."""

    def __init__(self, artifact, sample: list[np.ndarray]) -> None:
        self.artifact, self.sample = artifact, sample
        self.probe = probe_for(artifact.engine, artifact.files[0], artifact.runtime)
        try:
            self.values = self.probe.capture(sample)
            self.layers = self.probe.layers()  # after a capture: MACs at the sample's shapes
        except BaseException:
            self.probe.close()
            raise

    def names(self, probe, same: bool) -> "SourceNames":
        """The names of ``probe``'s layers (``same``: it is this model's own probe)."""
        return SourceNames.build(probe, self.sample, self.layers, self.values, same)

    def close(self) -> None:
        self.probe.close()

    def __enter__(self) -> "SourceModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SourceNames:
    """The source model's name of an engine's layer: the source layer holding the same numbers (:func:`align`), or,
    for a layer that multiplies (a convolution whose bias, batch norm or activation the engine folded into it), the
    source's multiplying op those numbers come from, so that a convolution has one name on every engine."""

    WALK = 6  # how many folded ops (bias Add, BatchNormalization, Relu...) back a multiplying op is looked for

    def __init__(self, source_layers: list[Layer], matched: dict[str, str], layers: list[Layer] = ()) -> None:
        self.source = {l.name: l for l in source_layers}
        self.matched = matched
        # an engine op that split a source op in two (OpenVINO: a bias-free Convolution, then an Add holding the
        # source's name and numbers): the multiplying half is named through its one consumer
        self.consumer: dict[str, Layer] = {}
        readers: dict[str, list[Layer]] = {}
        for l in layers:
            for i in l.inputs:
                readers.setdefault(i, []).append(l)
        self.consumer = {name: users[0] for name, users in readers.items() if len(users) == 1}

    @classmethod
    def build(cls, probe, sample: list[np.ndarray], source_layers: list[Layer], source_values: dict,
              same: bool) -> "SourceNames":
        values = source_values if same else probe.capture(sample)
        layers = probe.layers()
        return cls(source_layers, align(source_layers, source_values, layers, values), layers)

    def __call__(self, layer: Layer) -> tuple[str, str] | None:
        name = self.matched.get(layer.name, layer.name if layer.name in self.source else None)
        if name is None and layer.macs > 0 and layer.name in self.consumer and self.consumer[layer.name].macs == 0:
            user = self.consumer[layer.name]
            name = self.matched.get(user.name, user.name if user.name in self.source else None)
        if name is None:
            return None
        found = self.source[name]
        if layer.macs > 0 and found.macs == 0:
            step = found
            for _ in range(self.WALK):
                if not step.inputs or step.inputs[0] not in self.source:
                    break
                step = self.source[step.inputs[0]]
                if step.macs > 0:
                    found = step
                    break
        return found.node, found.name


def _samples(bundle, data: Any, count: int) -> list[list[np.ndarray]]:
    if count < 1:
        raise ConversionError(f"--samples must be at least 1, got {count}")
    if data is None:
        from edgesdk.runtime.numerics import golden_feeds

        return golden_feeds(bundle.golden(), len(bundle.manifest["inputs"]))[:count]
    from edgesdk.engines import TensorSpec

    from ..calibration import read_dataset

    inputs = [TensorSpec(t["name"], tuple(t["shape"]), t["dtype"]) for t in bundle.manifest["inputs"]]
    ds = read_dataset(data, inputs, bundle.preprocess, None, "debug")
    return [ds.load(i) for i in range(min(count, len(ds)))]


class _Opened:
    """A probe on an artifact for a ``with`` block (``shared``: something already holding an open ``probe`` of it,
    used instead)."""

    def __init__(self, artifact, shared=None) -> None:
        self.artifact, self.shared, self.probe = artifact, shared, None

    def __enter__(self) -> "_Opened":
        self.probe = self.shared.probe if self.shared is not None else probe_for(
            self.artifact.engine, self.artifact.files[0], self.artifact.runtime)
        return self

    def __exit__(self, *exc) -> None:
        if self.shared is None and self.probe is not None:
            self.probe.close()


# -- printing ---------------------------------------------------------------------------------------------------
def text(report: DebugReport, top: int = 10) -> str:
    """The worst ``top`` layers of each artifact by added error, then the names the engines share."""
    lines = [f"layer-by-layer INT8 error of {report.bundle} on {report.samples} samples, layers named by "
             f"{report.source_reference} (the source model's node names); SNR in dB, higher is better; added: the "
             f"layer alone on float inputs, accumulated: everything before it quantized too"]
    for e in report.engines:
        total = sum(r.macs for r in e.rows)
        lines += ["", f"{e.artifact} against {e.reference}: {len(e.rows)} layers"
                  + (f" ({e.unmatched} not found in the source)" if e.unmatched else "")
                  + (f", {total / 1e6:.1f} MMAC" if total else "") + f", {e.seconds:.1f} s",
                  f"  {'#':>3}  {'layer (source node)':<34} {'op':<14} {'added':>7} {'accum.':>7} {'cosine':>8} "
                  f"{'max|err|':>9} {'mean|err|':>9} {'MMAC':>7}"]
        for k, r in enumerate(worst(e.rows, top), 1):
            added = r.added.snr_db if r.added is not None and r.added.count else None
            acc = r.accumulated
            lines.append(f"  {k:>3}  {_cut(r.source or '(' + r.node + ')', 34):<34} {_cut(r.op, 14):<14} "
                         f"{_db(added):>7} {_db(acc.snr_db):>7} {acc.cosine:>8.5f} {acc.max_abs:>9.4g} "
                         f"{acc.abs_sum / max(acc.count, 1):>9.4g} {r.macs / 1e6:>7.2f}")
    if len(report.engines) > 1:
        tops = [{r.source for r in worst(e.rows, top) if r.source} for e in report.engines]
        shared = set.intersection(*tops)
        lines += ["", f"in every artifact's worst {top}: " + (", ".join(sorted(shared)) if shared else "none")]
    return "\n".join(lines)


def check_plotting() -> None:
    """Refuse now, before any work, when :func:`plot` could not draw: matplotlib is not installed."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ConversionError("--plot needs matplotlib (pip install matplotlib)")


def plot(report: DebugReport, path: Path) -> Path:
    """SNR (accumulated, and added as dots) along the network, one line per artifact, x = the source's layer order;
    written to ``path`` in the format its suffix names (.png, .svg, .pdf). A file that cannot be written is an
    :class:`~edgesdk.errors.InputError` naming it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConversionError("--plot needs matplotlib (pip install matplotlib)") from exc
    fig, ax = plt.subplots(figsize=(12, 4.5))
    for e in report.engines:
        rows = [(report.source_order[r.source_tensor], r) for r in e.rows if r.source_tensor in report.source_order]
        rows.sort(key=lambda pair: pair[0])
        line = ax.plot([x for x, _ in rows], [_clip(r.accumulated.snr_db) for _, r in rows],
                       label=f"{e.artifact} accumulated", linewidth=1)[0]
        added = [(x, _clip(r.added.snr_db)) for x, r in rows if r.added is not None and r.added.count]
        if added:
            ax.scatter(*zip(*added), s=6, color=line.get_color(), label=f"{e.artifact} added")
    ax.set_xlabel(f"layer, in the order of the source model ({report.source_reference})")
    ax.set_ylabel("SNR (dB)")
    ax.set_title(f"INT8 against float, layer by layer: {Path(report.bundle).name}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    try:
        fig.savefig(path, dpi=110, format=path.suffix[1:].lower() or "png")
    except OSError as exc:
        raise InputError(f"--plot {path} cannot be written: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)
    return path


def _clip(db: float) -> float:
    return max(-10.0, min(80.0, db))


def _db(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if value == float("inf") else f"{value:.1f}"


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"
