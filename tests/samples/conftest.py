"""Fixtures of the shapes detection sample: its data generator (loaded from the sample's own file), generated sets
and the detector quantized with its task and letterbox preprocess, built once per session with the real converters.
"""

from __future__ import annotations

import pytest

from shapes_support import CALIB_IMAGES, VAL_IMAGES, load_sample_module, quantize_shapes


@pytest.fixture(scope="session")
def shapes_data_module():
    return load_sample_module("data")


@pytest.fixture(scope="session")
def shapes_sets(tmp_path_factory, shapes_data_module):
    """data.py's sets, small: calib/, val/ (+ val.json), demo/, labels.txt."""
    return shapes_data_module.write_sets(tmp_path_factory.mktemp("shapes-data"), calib=CALIB_IMAGES, val=VAL_IMAGES,
                                         demo=2)


@pytest.fixture(scope="session")
def shapes_bundle(tmp_path_factory, shapes_sets):
    """The device bundle: every target's float and INT8 artifacts."""
    return quantize_shapes(tmp_path_factory.mktemp("shapes") / "shapes.bundle", shapes_sets).bundle
