"""Domain errors returned, not raised, across a deployment call.

A Serve replica whose method raises logs the traceback as a failed request,
and the caller receives Ray's wrapper around the error. A 404 or a 409 is an
answer, not a failure: :func:`errors_returned` makes a deployment class return
:class:`Refused` instead, and the caller's :func:`unwrapped` raises the domain
error itself, which the ingress answers with its status and message.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, TypeVar

from mmserver.errors import MMServerError

C = TypeVar("C", bound=type)


@dataclasses.dataclass(frozen=True)
class Refused:
    """A domain error as a deployment method's return value."""

    error: MMServerError


def unwrapped(result: Any) -> Any:
    """A deployment method's result, or its domain error raised."""
    if isinstance(result, Refused):
        raise result.error
    return result


def errors_returned(cls: C) -> C:
    """A subclass of ``cls`` whose public methods return :class:`Refused` for a domain error."""

    def returning(method):
        if inspect.iscoroutinefunction(method):
            @functools.wraps(method)
            async def refusing_async(self, *args, **kwargs):
                try:
                    return await method(self, *args, **kwargs)
                except MMServerError as error:
                    return Refused(error)
            return refusing_async

        @functools.wraps(method)
        def refusing(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except MMServerError as error:
                return Refused(error)
        return refusing

    methods = {name: returning(member) for name, member in vars(cls).items()
               if inspect.isfunction(member) and not name.startswith("_")}
    # Not findable by name in any module, so Ray pickles it by value, with its methods.
    return type(cls.__name__, (cls,), {**methods, "__doc__": cls.__doc__})
