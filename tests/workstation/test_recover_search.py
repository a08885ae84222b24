"""The recovery search itself (which layers it measures, tries and keeps, and how it weighs harm) on a model of a
network's gate: each layer left in INT8 adds its own noise to the outputs, the outputs' cosine is 1 - the summed
noise, and the gate passes below a noise budget. No engine runs here (test_recover.py runs the real ones): these pin
the order in which layers are measured and kept, which the real recognizer takes half an hour to show."""

from __future__ import annotations

import pytest

from edgesdk_converters.layers.compare import LayerError
from edgesdk_converters.recovery.search import HARMLESS, SHARE_SLACK, best, harm_of, search


def row(name: str, macs: int, added_db: float = 30.0) -> LayerError:
    return LayerError(name=name, op="CONV_2D" if macs else "ADD", node=name, position=0, macs=macs, quantized=True,
                      source=name)


class Gate:
    """Noise per layer name (``name``: the engine's name of a row); a set kept in float passes when the noise of the
    layers still in INT8 is under ``budget``. A layer in INT8 with the other range choice on its tensors adds its
    ``ranged`` noise instead (its own noise when not given). Records every trial as (step, names kept in float), the
    names given the other range choice in ``ranged_trials`` and the rows asked for in ``rows_seen``."""

    def __init__(self, noise: dict[str, float], budget: float, p50=lambda kept: None, ranged: dict | None = None,
                 name=lambda r: r.name):
        self.noise, self.budget, self.trials, self.p50 = noise, budget, [], p50
        self.ranged, self.ranged_trials, self.name, self.rows_seen = ranged or {}, [], name, []

    def __call__(self, rows, how=None, step="search", what="", ranged=()):
        kept, other = {self.name(r) for r in rows}, {self.name(r) for r in ranged}
        self.rows_seen += [frozenset(r.name for r in rows), frozenset(r.name for r in ranged)]
        self.trials.append((step, frozenset(kept)))
        self.ranged_trials.append(frozenset(other))
        total = sum(self.ranged.get(k, v) if k in other else v for k, v in self.noise.items() if k not in kept)
        return {"passed": total < self.budget, "cosine_similarity": 1.0 - total, "metric": "accuracy",
                "metric_value": 1.0 - total, "drop": 100 * total, "max_drop": 100 * self.budget,
                "latency_ms": self.p50(kept)}


def never(share: float = 1.0) -> bool:
    return False


def test_harm_reads_the_drop_in_its_own_unit_and_a_failure_first():
    px = {"passed": True, "cosine_similarity": 0.99, "drop": 2.0, "max_drop": 4.0}  # landmarks: px
    assert harm_of(px) == pytest.approx(0.01 + 0.5)
    assert harm_of({"passed": True, "cosine_similarity": None, "drop": None, "max_drop": 3.0}) == 0.0
    assert harm_of({"passed": True, "cosine_similarity": 1.0, "drop": -1.0, "max_drop": 3.0}) == 0.0  # a gain
    failed = {"passed": False, "cosine_similarity": 1.0, "drop": 0.0, "max_drop": 3.0}  # e.g. a dead output
    assert harm_of(failed) == 1.0 > harm_of(px)
    assert HARMLESS < 1e-3


def test_cheap_harmful_layers_are_kept_not_the_big_ones_added_error_ranks_first():
    # ranked as added error ranks them (the big convolutions worst), the gate as the recognizer behaves: two small
    # early layers break it, the big ones barely move the outputs
    ranked = [row("add", 0), row("big1", 1000), row("big2", 1000), row("small1", 10), row("small2", 10)]
    gate = Gate({"add": 0.03, "big1": 0.001, "big2": 0.001, "small1": 0.02, "small2": 0.02}, budget=0.01)
    kept, _ = search(ranked, gate, never)
    assert {r.name for r in kept} == {"add", "small1", "small2"}
    measured = [next(iter(set(n for n in ("big1", "big2", "small1", "small2")) - kept_)) for step, kept_ in
                gate.trials if step == "sensitivity"]
    assert measured == ["small1", "small2", "big1", "big2"]  # the fewest MACs first


def test_layers_measured_harmless_go_after_the_unmeasured_ones():
    ranked = [row("a", 0)] + [row(f"c{k}", 10 * (k + 1)) for k in range(4)]
    gate = Gate({"a": 0.5, "c0": 0.0, "c1": 0.0, "c2": 0.3, "c3": 0.3}, budget=0.1)
    clock = iter(range(1000))
    measured_two = lambda share=1.0: share == 0.4 and next(clock) >= 2  # noqa: E731  (two measurements, then out)
    kept, _ = search(ranked, gate, measured_two)
    assert {r.name for r in kept} == {"a", "c2", "c3"}
    first_search = next(kept_ for step, kept_ in gate.trials if step == "search" and kept_ != {"a"})
    assert first_search == {"a", "c2"}  # not a harmless c0 or c1: the unmeasured c2 comes before them


def test_a_passing_measurement_is_a_result_when_time_runs_out():
    ranked = [row("a", 0), row("c0", 10), row("c1", 20)]
    gate = Gate({"a": 0.5, "c0": 0.05, "c1": 0.5}, budget=0.1)
    after_measuring = lambda share=1.0: share > 0.4 and sum(s == "sensitivity" for s, _ in gate.trials) == 2  # noqa
    found = search(ranked, gate, after_measuring)
    assert found is not None and {r.name for r in found[0]} == {"a", "c1"}  # c0 alone in INT8 passed
    assert all(step in ("search", "sensitivity") for step, _ in gate.trials)


def test_rows_sharing_an_engine_name_are_not_measured_alone():
    ranked = [row("a", 0), row("x", 10), row("x #7", 20), row("y", 30)]
    gate = Gate({"a": 0.5, "x": 0.3, "y": 0.0}, budget=0.1)
    name = lambda r: r.name.split(" #")[0]  # noqa: E731  (as recovery names LiteRT rows)
    search(ranked, gate, never, name=name)
    alone = [frozenset({"a", "x", "x #7", "y"}) - kept for step, kept in gate.trials if step == "sensitivity"]
    assert alone == [frozenset({"y"})]


def test_among_sets_with_the_same_mac_share_the_fastest_is_kept_not_the_fewest_layers():
    # LiteRT runs its INT8 elementwise ops slower than float ones: each free layer kept in float makes it faster
    ranked = [row("a", 0), row("b", 0), row("c", 1000)]
    gate = Gate({"a": 0.5, "b": 0.0, "c": 0.0}, budget=0.1, p50=lambda kept: 10.0 - 2.5 * len(kept & {"a", "b"}))
    kept, _ = search(ranked, gate, never)
    assert [s for s, k in gate.trials] == ["search", "search"] and gate.trials[1][1] == {"a"}  # {a} passed too
    assert {r.name for r in kept} == {"a", "b"}


def test_a_set_with_fewer_macs_in_float_wins_over_a_faster_one():
    ranked = [row("a", 0), row("c", 10), row("d", 1000)]
    gate = Gate({"a": 0.5, "c": 0.5, "d": 0.05}, budget=0.1, p50=lambda kept: 1.0 if "d" in kept else 9.0)
    kept, _ = search(ranked, gate, never)
    assert {r.name for r in kept} == {"a", "c"}


def test_a_layer_failing_with_the_artifacts_ranges_comes_back_to_int8_with_the_other_choice():
    # as the recognizer's first depthwise convolutions on LiteRT: each breaks the model with running min/max and
    # passes with the mean of per-sample min/max on the tensors it reads; "c" is no better with it
    ranked = [row("a", 0), row("c", 10), row("d", 20)]
    noise = {"a": 0.5, "c": 0.3, "d": 0.3}
    gate = Gate(noise, budget=0.1, ranged={"d": 0.01, "c": 0.3})
    kept, ranged = search(ranked, gate, never, ranges=True)
    assert {r.name for r in kept} == {"a", "c"} and [r.name for r in ranged] == ["d"]
    assert ("ranges", frozenset({"a", "c"})) in gate.trials
    # without a per-layer range choice (OpenVINO) none is asked for, and both stay in float
    plain = Gate(noise, budget=0.1, ranged={"d": 0.01})
    kept, ranged = search(ranked, plain, never)
    assert {r.name for r in kept} == {"a", "c", "d"} and ranged == []
    assert not any(plain.ranged_trials) and all(step != "ranges" for step, _ in plain.trials)


def test_the_other_range_choice_is_tried_only_after_the_layer_failed_with_the_artifacts_own():
    ranked = [row("a", 0), row("c", 10), row("d", 20)]
    gate = Gate({"a": 0.5, "c": 0.3, "d": 0.0}, budget=0.1, ranged={"d": 0.0})
    kept, ranged = search(ranked, gate, never, ranges=True)
    assert {r.name for r in kept} == {"a", "c"} and ranged == []  # d passes as it is: no other range needed
    assert {"c"} in gate.ranged_trials and all(other <= {"c"} for other in gate.ranged_trials)  # c failed: tried


def test_rows_sharing_an_engine_name_are_kept_and_pruned_together():
    # LiteRT rows "t" and "t #1" are one tensor name to AI Edge Quantizer: keeping one keeps both, so a passing set
    # records both, and pruning never takes one back to INT8 alone (the converter would see no change)
    ranked = [row("a", 0), row("t", 100), row("t #1", 50), row("c", 10)]
    name = lambda r: r.name.split(" #")[0]  # noqa: E731  (as recovery names LiteRT rows)
    gate = Gate({"a": 0.5, "t": 0.3, "c": 0.3}, budget=0.1, ranged={"t": 0.0}, name=name)
    kept, ranged = search(ranked, gate, never, name=name, ranges=True)
    assert {r.name for r in kept} == {"a", "c"} and {r.name for r in ranged} == {"t", "t #1"}
    assert gate.rows_seen and all(("t" in k) == ("t #1" in k) for k in gate.rows_seen)


def test_pruning_starts_from_the_fastest_set_not_the_one_with_the_fewest_layers():
    # prefixes find {a, b, d, c}; the free tier shortened drops b ({a, d, c}, the same MACs); every free layer in
    # float runs faster (LiteRT's INT8 elementwise ops), so pruning works on {a, b, d, c} and finds {a, b, c}
    ranked = [row("a", 0), row("b", 0), row("c", 100), row("d", 1), row("e", 10000)]
    noise = {"a": 0.5, "b": 0.01, "c": 0.5, "d": 0.03, "e": 0.0}
    gate = Gate(noise, budget=0.05, p50=lambda kept: 10.0 - 4.0 * len(kept & {"a", "b"}))
    kept, _ = search(ranked, gate, never)
    assert ("search", frozenset({"a", "d", "c"})) in gate.trials  # the shortened free tier passed
    pruned = [k for step, k in gate.trials if step == "prune"]
    assert pruned and all("b" in k for k in pruned), pruned
    assert {r.name for r in kept} == {"a", "b", "c"}
    # when every set runs as fast, the one with the fewest layers is pruned and kept
    slow = Gate(noise, budget=0.05, p50=lambda kept: 1.0)
    kept, _ = search(ranked, slow, never)
    assert {r.name for r in kept} == {"a", "c"}


def test_within_a_point_of_the_most_macs_in_int8_the_fastest_set_is_kept():
    # the recognizer on LiteRT: 2.5% of the MACs in float at 13.9 ms, 3.0% with every elementwise op float at 7.4 ms
    total = 10000
    lean, fast = [row("c", 250)], [row("a", 0), row("b", 0), row("c", 250), row("d", 50)]
    far = [row("a", 0), row("e", 250 + int(SHARE_SLACK * total) + 1)]
    assert best([(lean, [], 13.9), (fast, [], 7.4)], total)[0] is fast
    assert best([(lean, [], 13.9), (far, [], 1.0)], total)[0] is lean  # more than a point further: MACs first
    assert best([(lean, [], 13.9), (fast, [], 7.4)], total, fastest=False)[0] is lean
    assert best([(fast, [], 7.4), (lean, [], 7.4)], total)[0] is lean  # same speed: the fewest MACs in float
    assert best([], total) is None
