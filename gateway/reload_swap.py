"""Putting reloaded settings in force: every reference the running object graph holds to the old
settings (the ``Settings`` object, one of its sections, an agent's block, a list or mapping of
it) is pointed at its counterpart in the new settings.

Why a walk rather than a ``reconfigure`` method per class: the settings reach dozens of objects
(the conversation engine, its compactors, the scheduling, webhooks, memory recall, the hooks'
closures), each keeping the part it needs; the walk finds every one by identity, so an object
added later is covered without being told. Values derived from settings at construction (a
semaphore's size, a cached number) are not: the keys they come from need a restart
(``gateway.reload.RESTART``).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pydantic import BaseModel

PROJECT = {"gateway", "sessions", "home", "memory", "channels", "scheduler", "backups", "conversations"}
Mapping_ = dict[int, tuple[Any, Any]]


def counterparts(old: Any, new: Any, found: Mapping_ | None = None) -> Mapping_:
    """``{id(old part): (old part, new part)}`` for the settings and every section, block, list
    and mapping in them that the new settings also have."""
    found = {} if found is None else found
    if isinstance(old, BaseModel) and type(old) is type(new):
        found[id(old)] = (old, new)
        for name in type(old).model_fields:
            counterparts(getattr(old, name), getattr(new, name), found)
    elif isinstance(old, dict) and isinstance(new, dict):
        found[id(old)] = (old, new)
        for key, value in old.items():
            if key in new:
                counterparts(value, new[key], found)
    elif isinstance(old, tuple) and isinstance(new, tuple) and old:  # () is one shared object
        found[id(old)] = (old, new)
    return found


def _mapped(value: Any, parts: Mapping_) -> tuple[bool, Any]:
    pair = parts.get(id(value))
    if pair is not None and pair[0] is value:
        return True, pair[1]
    return False, None


def _ours(obj: Any) -> bool:
    return type(obj).__module__.split(".", 1)[0] in PROJECT


Put = Callable[[Any], None]  # replaces the reference a slot holds


def _references(obj: Any) -> Iterator[tuple[Any, Put | None]]:
    """What ``obj`` refers to, each with how to replace that reference (None: it is only walked
    further: a method's object and function, a partial's parts, a tuple's or a set's items)."""
    if isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            yield value, functools.partial(setattr, cell, "cell_contents")
    elif isinstance(obj, types.MethodType):
        yield obj.__self__, None
        yield obj.__func__, None
    elif isinstance(obj, functools.partial):
        yield from ((part, None) for part in (obj.func, *obj.args, *obj.keywords.values()))
    elif isinstance(obj, dict | list):
        for slot, value in list(obj.items() if isinstance(obj, dict) else enumerate(obj)):
            yield value, functools.partial(obj.__setitem__, slot)
    elif isinstance(obj, (tuple, set, frozenset)):
        yield from ((item, None) for item in obj)
    elif _ours(obj):
        names = getattr(obj, "__dict__", {})
        slots = [s for cls in type(obj).__mro__ for s in getattr(cls, "__slots__", ())]
        for name in [*names, *slots]:
            try:
                value = getattr(obj, name)
            except AttributeError:
                continue
            yield value, functools.partial(object.__setattr__, obj, name)  # frozen dataclasses too


def swap(roots: Iterable[Any], parts: Mapping_) -> int:
    """Point every reference under ``roots`` (objects of the project's packages, their
    containers, bound methods, partials and closures) at the new settings; how many changed."""
    seen: set[int] = set()
    stack = list(roots)
    changed = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (BaseModel, str, bytes, int, float, type)):
            continue
        seen.add(id(obj))
        for value, put in _references(obj):
            hit, new = _mapped(value, parts) if put is not None else (False, None)
            if hit and put is not None:
                put(new)
                changed += 1
            else:
                stack.append(value)
    return changed
