"""The one-zone fake sysfs tree the thermal tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from thermal_support import zone


@pytest.fixture
def one_zone(tmp_path) -> Path:
    zone(tmp_path, 0, "cpu-thermal", 40000)
    return tmp_path
