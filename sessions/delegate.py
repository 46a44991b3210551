"""``Delegate``: a method of an object composed of parts that is one of its parts' methods;
``PartField``: a field of such an object that is one of its parts' fields, read-only.

``append = Delegate("appends", Appends.append)`` in a class body makes ``obj.append`` the bound
``obj.appends.append``: typed as the part's method (mypy checks the composed object against a
Protocol through it), the part's function on the class (``inspect`` sees a coroutine function
where the part has one), and bound once per object (kept in the object's ``__dict__``), so a call
costs no more than the part's own. ``store: PartField[ConversationStore] = PartField("core")``
makes ``obj.store`` read ``obj.core.store`` at each access (the part's field may be replaced, as a
reload replaces the settings); setting it is refused, as it would leave the part behind. The
session stores and ``Conversations`` are composed so."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, NoReturn, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")
T = TypeVar("T")


class Delegate(Generic[S, P, R]):
    def __init__(self, part: str, method: Callable[Concatenate[S, P], R]) -> None:
        self.part = part
        self.method = method
        self.name = method.__name__

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.name:
            raise TypeError(f"{owner.__name__}.{name} delegates to {self.part}.{self.name}: give both one name")

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Callable[Concatenate[S, P], R]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Callable[P, R]: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self.method
        bound = getattr(getattr(obj, self.part), self.name)
        obj.__dict__[self.name] = bound  # found there from now on, before this descriptor
        return bound


class PartField(Generic[T]):
    def __init__(self, part: str) -> None:
        self.part = part
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> PartField[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: object, value: T) -> NoReturn:
        raise AttributeError(f"{self.name} is the {self.part}'s: set it there")
