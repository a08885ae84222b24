"""Tests go through public APIs: a private name of ours used in a test carries a comment saying why (on its line or
the line above), so that reaching into internals is a decision, not a habit."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# obj._name (not self._x inside a test's own helper class, not dunders) and `import _name` from our packages
ATTRIBUTE = re.compile(r"(?<!\\)\b(?!self\b|cls\b|os\b|sys\b|numpy\b|interp\b|proxy\b)[a-z_][a-z0-9_]*\._[a-z][a-z0-9_]*\b")
IMPORT = re.compile(r"^\s*from (edgesdk|edgesdk_converters|edgesdk_cloud)[\w.]* import .*\b_[a-z]")


def uncommented(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    found = []
    for i, line in enumerate(lines):
        code = line.split("#", 1)[0]
        hit = IMPORT.search(code) or ATTRIBUTE.search(code.replace("._asdict", ""))
        if hit and "#" not in line and not lines[i - 1].lstrip().startswith("#") and "# private" not in " ".join(
                lines[max(0, i - 3):i]):
            found.append(f"{path.relative_to(TESTS)}:{i + 1}: {line.strip()}")
    return found


def test_every_private_name_in_a_test_says_why():
    found = [hit for path in sorted(TESTS.rglob("*.py")) if path.name != Path(__file__).name
             for hit in uncommented(path)]
    assert not found, "a private name in a test needs a comment saying why:\n" + "\n".join(found)
