"""The vocabulary the manifest schema (:mod:`.schema`) is written in: small checkers (``Str``, ``Int``, ``Num``,
``Bool``, ``OneOf``, ``Nullable``, ``ListOf``, ``MapOf``, ``Obj``, ``Rule``) that each say what they expected and
where, so one pass over a manifest names every problem with its JSON path."""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from ..numbers import is_number

# control characters, line breaks, bidi overrides and lone surrogates: never in a name shown on a terminal
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


# -- helpers ------------------------------------------------------------------------
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _join(path: str, key: Any) -> str:
    key = str(key)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{_show(key)}]"


def _at(path: str) -> str:
    return path or "the manifest"


def _show(value: Any, limit: int = 60) -> str:
    """``value`` as it reads in the JSON file (so a string shows its quotes), shortened."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True)
        if not text.isprintable():  # a control character would draw on the terminal, a lone surrogate fails to print
            text = json.dumps(value, allow_nan=True)  # every character outside printable ASCII escaped
    except (TypeError, ValueError, RecursionError):  # not JSON (a caller's own object), or an int too long to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the checker -------------------------------------------------------------------
class Spec:
    """One node of the schema: ``check`` appends ``"<path> <problem>"`` strings to ``problems``."""

    expected = "a value"

    def check(self, value: Any, path: str, problems: list[str]) -> None:
        if not self.accepts(value):
            problems.append(f"{_at(path)} must be {self.expected}, got {_show(value)}")

    def accepts(self, value: Any) -> bool:
        return True


class Str(Spec):
    """A string; ``plain``: one line of printable text (a name shown on a terminal or written into other files)."""

    def __init__(self, nonempty: bool = False, pattern: re.Pattern | None = None, expected: str | None = None,
                 plain: bool = False):
        self.nonempty, self.pattern, self.plain = nonempty, pattern, plain
        self.expected = expected or ("a non-empty string" if nonempty else "a string")

    def accepts(self, value):
        return (isinstance(value, str) and (bool(value) or not self.nonempty)
                and (self.pattern is None or self.pattern.fullmatch(value) is not None))

    def check(self, value, path, problems):
        super().check(value, path, problems)
        if self.plain and isinstance(value, str) and _CONTROL.search(value):
            problems.append(f"{_at(path)} must be one line of printable text (no control characters, line breaks, "
                            f"bidi overrides or lone surrogates), got {_show(value)}")


class Int(Spec):
    def __init__(self, minimum: int | None = None, expected: str = "an integer", maximum: int | None = None):
        self.minimum, self.maximum, self.expected = minimum, maximum, expected

    def accepts(self, value):
        return (_is_int(value) and (self.minimum is None or value >= self.minimum)
                and (self.maximum is None or value <= self.maximum))


class Num(Spec):
    """A finite real number (JSON's NaN and Infinity are refused), optionally within [low, high]."""

    def __init__(self, low: float | None = None, high: float | None = None, expected: str = "a number"):
        self.low, self.high, self.expected = low, high, expected

    def accepts(self, value):
        return (is_number(value) and (self.low is None or value >= self.low)
                and (self.high is None or value <= self.high))


class Scalar(Spec):
    """A finite number or true/false: one value of a tensor (an input a model was specialized for)."""

    expected = "a number or true/false"

    def accepts(self, value):
        return isinstance(value, bool) or is_number(value)


class Bool(Spec):
    expected = "true or false"

    def accepts(self, value):
        return isinstance(value, bool)


class OneOf(Spec):
    def __init__(self, *values: Any):
        self.values = values
        self.expected = "one of " + ", ".join(_show(v) for v in values)

    def accepts(self, value):
        return any(type(value) is type(v) and value == v for v in self.values)


class Nullable(Spec):
    """``spec``, or null."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.expected = f"{spec.expected} or null"

    def check(self, value, path, problems):
        if value is None:
            return
        found: list[str] = []
        self.spec.check(value, path, found)
        # A value of the wrong kind here could also have been null: say so (deeper problems stay as they are).
        mine = f"{_at(path)} must be {self.spec.expected}, "
        problems += [f"{_at(path)} must be {self.expected}, {p[len(mine):]}" if p.startswith(mine) else p
                     for p in found]


class ListOf(Spec):
    def __init__(self, item: Spec, nonempty: bool = False):
        self.item, self.nonempty = item, nonempty
        self.expected = "a non-empty list" if nonempty else "a list"

    def check(self, value, path, problems):
        if not isinstance(value, list) or (self.nonempty and not value):
            problems.append(f"{_at(path)} must be {self.expected}, got {_show(value)}")
            return
        for i, item in enumerate(value):
            self.item.check(item, f"{path}[{i}]", problems)


class MapOf(Spec):
    """An object whose keys are names (artifact ids, ...) and whose values follow ``value``; a key of ``special``
    follows its own spec instead. ``keys``, when given, checks each key (as ``<path> key <key>``)."""

    expected = "an object"

    def __init__(self, value: Spec, special: dict[str, Spec] | None = None, keys: Spec | None = None):
        self.value, self.special, self.keys = value, special or {}, keys

    def check(self, value, path, problems):
        if not isinstance(value, dict):
            problems.append(f"{_at(path)} must be {self.expected}, got {_show(value)}")
            return
        for key, item in value.items():
            if self.keys is not None:
                self.keys.check(key, f"{_at(path)} key", problems)
            self.special.get(key, self.value).check(item, _join(path, key), problems)


class Obj(Spec):
    """An object with known keys: ``required`` must be there, ``optional`` may be. Other keys are accepted
    (forward compatibility) unless ``closed``."""

    expected = "an object"

    def __init__(self, required: dict[str, Spec] | None = None, optional: dict[str, Spec] | None = None,
                 closed: bool = False):
        self.required, self.optional, self.closed = required or {}, optional or {}, closed

    def check(self, value, path, problems):
        if not isinstance(value, dict):
            problems.append(f"{_at(path)} must be {self.expected}, got {_show(value)}")
            return
        missing = [k for k in self.required if k not in value]
        if missing:
            problems.append(f"{_at(path)} is missing key(s) {', '.join(missing)}")
        if self.closed:
            known = {*self.required, *self.optional}
            unknown = [k for k in value if k not in known]
            if unknown:
                problems.append(f"{_at(path)} has unknown key(s) {', '.join(map(_show, unknown))} "
                                f"(known: {', '.join(sorted(known))})")
        for fields in (self.required, self.optional):
            for key, spec in fields.items():
                if key in value:
                    spec.check(value[key], _join(path, key), problems)


class Rule(Spec):
    """A check written as a function: it returns the problem (without the path), or None."""

    def __init__(self, rule: Callable[[Any], str | None]):
        self.rule = rule

    def check(self, value, path, problems):
        problem = self.rule(value)
        if problem:
            problems.append(f"{_at(path)} {problem}")
