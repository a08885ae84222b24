"""Read-only values handed to the caller: a model's placement and budget state, shared by its results.

A :class:`~edgesdk.Result` carries its model's placement and budget entry without copying them per prediction
(a copy costs more than the rest of the bookkeeping of a tiny model's ``predict``). So they are made read-only
once, when they change (load, a thermal switch, the precision choice): :func:`freeze` turns dicts into
:class:`FrozenDict` and lists into :class:`FrozenList`, all the way down. They are still a ``dict`` and a ``list``
for every reader (``==`` with a plain one, ``json.dumps``, ``isinstance``), so code that reads a placement or a
budget reads it as before; they refuse every change with a ``TypeError``. :func:`thaw` (or ``placement.to_dict()``)
gives plain, mutable data; ``copy.deepcopy`` and ``dataclasses.asdict`` keep the read-only types.
(Not ``MappingProxyType`` and tuples: ``json.dumps`` refuses the one, and a tuple compares unequal to the list a
reader may compare it with, silently.)
"""

from __future__ import annotations

from typing import Any, NoReturn


def _refuse(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    kind = type(self).__mro__[1].__name__
    raise TypeError(f"this {kind} is read-only (a model's state, shared by its results); "
                    f"edgesdk.frozen.thaw(it) or {kind}(it) is a mutable copy")


class FrozenDict(dict):
    """A dict that refuses changes (``TypeError``, naming the way to get a mutable copy). Copies of it are itself,
    as for a tuple; it pickles as a FrozenDict. Hashing it fails, as for a dict (its values need not be hashable)."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __copy__(self) -> "FrozenDict":
        return self

    def __deepcopy__(self, memo: dict) -> "FrozenDict":
        return self

    def __reduce__(self):
        return FrozenDict, (dict(self),)

    def __repr__(self) -> str:
        return dict.__repr__(self)


class FrozenList(list):
    """A list that refuses changes, as :class:`FrozenDict` does."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = clear = extend = insert = pop = remove = reverse = sort = _refuse

    def __copy__(self) -> "FrozenList":
        return self

    def __deepcopy__(self, memo: dict) -> "FrozenList":
        return self

    def __reduce__(self):
        return FrozenList, (list(self),)

    def __repr__(self) -> str:
        return list.__repr__(self)


def freeze(value: Any) -> Any:
    """``value`` with every dict and list inside made read-only (a FrozenDict, a FrozenList), at any depth; the items
    of a tuple too. Anything else is returned as it is: numbers, strings, enums, frozen dataclasses."""
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    if type(value) is tuple:  # a namedtuple is left as it is
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Plain, mutable data from ``value``: a dict for every dict and a list for every list (frozen or not), at any
    depth."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    if type(value) is tuple:
        return tuple(thaw(v) for v in value)
    return value


__all__ = ["FrozenDict", "FrozenList", "freeze", "thaw"]
