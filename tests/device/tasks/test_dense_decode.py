"""Decoding of the other tasks (edgesdk.tasks.decode) on hand-built tensors with known answers: segmentation masks
(probability and classes, channel layouts, mapped back through a letterbox), CTC text (collapse and blank rules,
charset mapping), landmarks (pixels, normalized, visibility), values, embeddings, classification and raw, and the
errors naming the role, the output and its shape."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import InputError
from edgesdk.tasks.decode import decode
from edgesdk.tasks.geometry import Transform
from edgesdk.tasks.spec import TaskSpec


# -- segmentation -----------------------------------------------------------------------------------------------------
def seg_spec(**params) -> TaskSpec:
    return TaskSpec.make("segmentation", {"map": "out"}, **params)


def block_map(h=8, w=10, value=0.9, rows=slice(2, 5), cols=slice(3, 7)) -> np.ndarray:
    prob = np.full((h, w), 0.1, np.float32)
    prob[rows, cols] = value
    return prob


def test_probability_mask_is_the_pixels_over_the_threshold():
    prob = block_map()
    prob[2, 3] = 0.5  # not over 0.5
    decoded = decode(seg_spec(), [prob[None, None]], ["out"], labels=["text"])
    (mask,) = decoded.masks
    assert mask.mask.shape == (8, 10) and mask.area == 11 and not mask.mask[2, 3]
    assert (mask.class_index, mask.label) == (0, "text") and mask.score == pytest.approx(0.9)
    assert np.array_equal(decoded.score_map, prob)
    assert mask.to_dict()["box"] == [3, 2, 7, 5]
    assert decode(seg_spec(threshold=0.95), [prob[None, None]], ["out"]).masks[0].area == 0


@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "NHW"])
def test_probability_map_layouts_and_sigmoid(layout):
    logits = np.log(block_map() / (1 - block_map()))
    tensor, axis = {"NCHW": (logits[None, None], 1), "NHWC": (logits[None, ..., None], 3),
                    "NHW": (logits[None], 1)}[layout]
    decoded = decode(seg_spec(activation="sigmoid", channel_axis=axis), [tensor], ["out"])
    assert decoded.masks[0].area == 12
    assert decoded.score_map == pytest.approx(block_map(), abs=1e-6)


def test_a_probability_map_with_many_channels_names_role_output_and_channel_axis():
    nhwc = block_map()[None, ..., None]  # read with channel_axis 1 it has 8 channels
    with pytest.raises(InputError, match=r"role 'map' \(output 'out'\) has 8 channels on channel_axis 1.*kind "
                                         r"'probability' needs one"):
        decode(seg_spec(), [nhwc], ["out"])
    with pytest.raises(InputError, match=r"role 'map' \(output 'out'\) has shape \[1, 1, 8, 10, 1\]"):
        decode(seg_spec(), [nhwc[None]], ["out"])
    with pytest.raises(InputError, match=r"softmax' over the one channel of output 'out'"):
        decode(seg_spec(activation="softmax"), [nhwc[..., 0][:, None]], ["out"])


def test_class_map_gives_one_mask_per_class_present():
    logits = np.zeros((4, 6, 8), np.float32)
    logits[0] = 1.0  # background everywhere ...
    logits[2, 1:3, 1:4] = 5.0  # ... but a block of class 2; class 1 and 3 nowhere
    logits[3, 5, 7] = 3.0  # and one pixel of class 3
    decoded = decode(seg_spec(kind="classes", activation="softmax"), [logits[None]], ["out"],
                     labels=["bg", "cat", "dog", "eel"])
    assert [(m.class_index, m.label, m.area) for m in decoded.masks] == [(0, "bg", 48 - 7), (2, "dog", 6),
                                                                         (3, "eel", 1)]
    expected = np.exp(5.0) / (np.exp(5.0) + np.exp(1.0) + 2)  # softmax of (1, 0, 5, 0)
    assert decoded.masks[1].score == pytest.approx(expected)
    assert decoded.score_map.dtype.kind == "i" and decoded.score_map[1, 1] == 2 and decoded.score_map[0, 0] == 0


def test_masks_are_mapped_back_through_the_letterbox():
    transform = Transform.letterbox((20, 40), (16, 16))  # scale 0.4: the image is 16x8, 4 rows of padding on top
    assert transform.content == (0, 4, 16, 8)
    classes = np.zeros((2, 16, 16), np.float32)
    classes[0] = 1.0
    classes[1, 4:8, 8:16] = 2.0  # the top right quarter of the image
    classes[1, 0:4, :] = 2.0  # in the padding: gone once mapped
    decoded = decode(seg_spec(kind="classes"), [classes[None]], ["out"], transform=transform)
    assert decoded.score_map.shape == (20, 40)
    (bg, fg) = decoded.masks
    assert fg.mask[:10, 20:].all() and fg.area == 200
    prob = np.zeros((16, 16), np.float32)
    prob[4:8, 8:16] = 1.0
    decoded = decode(seg_spec(), [prob[None, None]], ["out"], transform=transform)
    assert decoded.score_map.shape == (20, 40) and decoded.masks[0].mask[:9, 21:].all()
    assert not decoded.masks[0].mask[11:, :].any() and not decoded.masks[0].mask[:, :19].any()


def test_a_map_smaller_than_the_input_is_scaled_to_it():
    prob = np.zeros((8, 8), np.float32)  # a stride-2 head over a 16x16 input
    prob[2:4, 4:8] = 1.0
    decoded = decode(seg_spec(), [prob[None, None]], ["out"], transform=Transform.letterbox((20, 40), (16, 16)))
    assert decoded.score_map.shape == (20, 40) and decoded.masks[0].mask[:9, 21:].all()


# -- text -------------------------------------------------------------------------------------------------------------
def steps(classes: list[int], n_classes: int = 4, top: list[float] | None = None) -> np.ndarray:
    """[1, T, C] probabilities whose arg-max per step is ``classes`` (top-1 = ``top`` or 0.7)."""
    top = top or [0.7] * len(classes)
    probs = np.zeros((len(classes), n_classes), np.float32)
    for t, (c, p) in enumerate(zip(classes, top)):
        probs[t] = (1 - p) / (n_classes - 1)
        probs[t, c] = p
    return probs[None]


def text_spec(**params) -> TaskSpec:
    return TaskSpec.make("text", {"logits": "out"}, **params)


def test_ctc_collapses_runs_drops_blanks_and_keeps_letters_split_by_a_blank():
    probs = steps([0, 1, 1, 0, 1, 2, 2, 0, 0, 3, 0], top=[.9, .6, .8, .9, .7, .5, .55, .9, .9, .65, .9])
    line = decode(text_spec(charset=["a", "b", "c"]), [probs], ["out"]).text
    assert line.text == "aabc"
    assert line.char_confidences == pytest.approx((0.8, 0.7, 0.55, 0.65))  # the best step of each run
    assert line.confidence == pytest.approx(np.mean([0.8, 0.7, 0.55, 0.65]))


def test_ctc_with_the_blank_last_and_without_a_charset():
    probs = steps([3, 0, 0, 3, 2, 1])
    assert decode(text_spec(charset=["a", "b", "c"], blank=3), [probs], ["out"]).text.text == "acb"
    assert decode(text_spec(), [probs], ["out"]).text.text == "3 3 2 1"  # no charset: class indices
    assert decode(text_spec(), [steps([0, 0])], ["out"]).text.text == ""


def test_ctc_softmax_activation_and_an_output_without_batch_axis():
    logits = np.log(steps([1, 0, 2]))[0]  # [T, C] logits
    line = decode(text_spec(charset=["x", "y", "z"], activation="softmax"), [logits], ["out"]).text
    assert line.text == "xy" and line.char_confidences == pytest.approx((0.7, 0.7))


def test_ctc_charset_and_blank_must_fit_the_classes():
    with pytest.raises(InputError, match=r"charset has 2 entries, but output 'out' \(role 'logits'\) has 4 classes.*"
                                         r"needs 3"):
        decode(text_spec(charset=["a", "b"]), [steps([1])], ["out"])
    with pytest.raises(InputError, match=r"blank 4 is not a class of output 'out' \(role 'logits'\): it has 4"):
        decode(text_spec(blank=4), [steps([1])], ["out"])
    with pytest.raises(InputError, match=r"role 'logits' \(output 'out'\) has shape \[1, 1, 2, 4\]"):
        decode(text_spec(), [steps([1, 2])[None]], ["out"])


# -- landmarks --------------------------------------------------------------------------------------------------------
def lm_spec(**params) -> TaskSpec:
    roles = {"points": "points", **params.pop("roles", {})}
    return TaskSpec.make("landmarks", roles, **params)


def test_landmarks_in_pixels_are_mapped_through_the_letterbox():
    transform = Transform.letterbox((200, 400), (128, 128))  # scale 0.32, 32 rows of padding on top
    points = np.array([[32, 48, 96, 80, 64, 64]], np.float32)  # [1, P * 2]
    decoded = decode(lm_spec(), [points], ["points"], transform=transform)
    assert np.allclose(decoded.landmarks.points, [[100, 50], [300, 150], [200, 100]])
    assert decoded.landmarks.visibility is None


def test_normalized_landmarks_with_depth_and_visibility():
    points = np.array([[[0.5, 0.25, 0.1], [1.0, 1.0, -0.05]]], np.float32)  # [1, P, 3]
    visibility = np.array([[0.0, 2.0]], np.float32)
    spec = lm_spec(dims=3, coordinates="normalized", roles={"visibility": "vis"})
    decoded = decode(spec, [points, visibility, np.array([[9.0]])], ["points", "vis", "presence"],
                     transform=Transform.identity(100, 200))
    assert np.allclose(decoded.landmarks.points, [[100, 25, 20], [200, 100, -10]])
    assert decoded.landmarks.visibility.tolist() == pytest.approx([0.5, 1 / (1 + np.exp(-2.0))])
    flat = decode(lm_spec(dims=3), [points.reshape(1, 1, 1, 6)], ["points"])  # [1, 1, 1, P * 3], MediaPipe's
    assert flat.landmarks.points.shape == (2, 3)


def test_landmark_errors_name_the_role_output_and_shape():
    with pytest.raises(InputError, match=r"coordinates 'normalized' needs the model input's size"):
        decode(lm_spec(coordinates="normalized"), [np.zeros((1, 4))], ["points"])
    with pytest.raises(InputError, match=r"role 'points' \(output 'points'\) has shape \[1, 5\]; the task needs P "
                                         r"points of 2 values"):
        decode(lm_spec(), [np.zeros((1, 5))], ["points"])
    with pytest.raises(InputError, match=r"role 'visibility' \(output 'vis'\) has shape \[1, 3\]; the task needs one "
                                         r"value per point: \[1, 2\]"):
        decode(lm_spec(roles={"visibility": "vis"}), [np.zeros((1, 4)), np.zeros((1, 3))], ["points", "vis"])


# -- values, embedding, classification, raw ---------------------------------------------------------------------------
def test_values_embedding_classification_and_raw():
    out = np.array([[0.25, 0.75]], np.float32)
    values = decode(TaskSpec.make("probability", {"values": "p"}), [out], ["p"]).values
    assert values.dtype == np.float64 and values.tolist() == [0.25, 0.75]
    assert decode(TaskSpec.make("regression", {"values": "v"}), [np.float32(3.5)], ["v"]).values.tolist() == [3.5]
    emb = decode(TaskSpec.make("embedding", {"embedding": "e"}), [np.array([[3.0, 4.0]])], ["e"]).embedding
    assert emb.tolist() == pytest.approx([0.6, 0.8])
    raw_emb = decode(TaskSpec.make("embedding", {"embedding": "e"}, normalize=False), [np.array([[3.0, 4.0]])], ["e"])
    assert raw_emb.embedding.tolist() == [3.0, 4.0]
    zero = decode(TaskSpec.make("embedding", {"embedding": "e"}), [np.zeros((1, 3))], ["e"]).embedding
    assert zero.tolist() == [0.0, 0.0, 0.0]
    probs = decode(TaskSpec.make("classification", {"scores": "s"}, softmax=True), [np.log([[1.0, 3.0]])], ["s"])
    assert probs.task == "classification" and probs.values.tolist() == pytest.approx([0.25, 0.75])
    raw = decode(TaskSpec.make("raw"), [out], ["p"])
    assert raw.task == "raw" and raw.to_dict() == {"task": "raw"}


def test_value_errors():
    with pytest.raises(InputError, match=r"role 'values' \(output 'p'\) has batch 2"):
        decode(TaskSpec.make("probability", {"values": "p"}), [np.zeros((2, 1))], ["p"])
    with pytest.raises(InputError, match=r"decode got 1 output\(s\) for 2 name\(s\)"):
        decode(TaskSpec.make("probability", {"values": "p"}), [np.zeros((1, 1))], ["p", "q"])


def test_a_presence_logit_becomes_the_landmarks_presence_score():
    """MediaPipe's face mesh: 468 x 3 points and one face-presence logit ([1, 1, 1, 1]) read through a sigmoid."""
    spec = TaskSpec.make("landmarks", {"points": "pts", "presence": "face"}, dims=3).resolved(["pts", "face"])
    points = np.arange(468 * 3, dtype=np.float32).reshape(1, 1, 1, 1404) % 190
    found = decode(spec, [points, np.array([[[[2.0]]]], np.float32)], ["pts", "face"]).landmarks
    assert found.points.shape == (468, 3) and found.presence == pytest.approx(1 / (1 + np.exp(-2.0)))
    raw = TaskSpec.make("landmarks", {"points": "pts", "presence": "face"}, presence_activation="none")
    assert decode(raw, [points[..., :4], np.array([[0.25]], np.float32)], ["pts", "face"]).landmarks.presence == 0.25
    with pytest.raises(InputError, match=r"role 'presence' \(output 'face'\) .*one score"):
        decode(raw, [points[..., :4], np.zeros((1, 2), np.float32)], ["pts", "face"])
    assert decode(TaskSpec.make("landmarks", {"points": "pts"}), [points[..., :4]], ["pts"]).landmarks.presence is None
