"""The ``serve`` flags: one per setting, generated from the Settings fields, so that no setting can lack its
flag (they were written by hand, and the audit and spool settings had none).

A flag is the option of the field's name (``spool_limit`` → ``--spool-limit``) with the field's description
as help and its bounds; given, it sets the ``LATEBANDIT_*`` variable of the same name, and Settings reads the
variables as without flags (one parsing and one validation for both)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from types import NoneType, UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import typer
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from latebandit.config import Settings


def flag_name(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def variable_name(setting: str) -> str:
    return f"LATEBANDIT_{setting.upper()}"


def _flag_type(annotation: Any) -> Any:
    """The type the flag parses: the field's, without None, a secret as the plain string it is given as."""
    if get_origin(annotation) in (Union, UnionType):
        (annotation,) = (part for part in get_args(annotation) if part is not NoneType)
    return str if annotation is SecretStr else annotation


def _option(field: FieldInfo) -> Any:
    """The field's bounds (pydantic keeps ``ge``/``le`` as metadata objects with that attribute) as typer's."""
    bounds = {
        option: getattr(constraint, bound)
        for constraint in field.metadata
        for bound, option in (("ge", "min"), ("le", "max"))
        if hasattr(constraint, bound)
    }
    return typer.Option(help=field.description, show_default=False, **bounds)


def with_setting_flags(command: Callable[..., None]) -> Callable[..., None]:
    """``command(**flags)`` with one keyword option per setting, each None unless given on the command line."""
    parameters = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[_flag_type(field.annotation) | None, _option(field)],
        )
        for name, field in Settings.model_fields.items()
    ]
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return command


def export_flags(flags: Mapping[str, object]) -> None:
    """Set the variable of every flag given, so that Settings (here, and in each uvicorn worker) reads it."""
    for name, value in flags.items():
        if value is not None:
            os.environ[variable_name(name)] = str(value)
