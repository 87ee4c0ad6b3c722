"""TOML tables checked by pydantic: unknown keys refused, types strict, one line per problem.

The simulator's files (scenarios, their ``[feed]``) are read the way the daemon's config
is (``powerbudgetd.config``): pydantic models with ``extra="forbid"``, and each
problem reported as the key's path, what was wrong, and the value given::

    events[2].limit_w: Input should be a valid number, got 'abc'

Strict types: a number written as a string, ``1`` for ``true`` or ``1.5`` for an
integer is refused, not converted. A :data:`Number` keeps the int or float it was given,
so the objects built from a table hold exactly what the file wrote.
"""

from __future__ import annotations

import difflib
import math
import typing
from typing import Annotated, Any, ClassVar, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

MAX_SHOWN_VALUE = 80


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError("float_type", "Input should be a valid number")
    if not math.isfinite(value):  # TOML's nan and inf: no figure a simulation can run on
        raise PydanticCustomError("finite_number", "Input should be a finite number")
    return value


Number = Annotated[float, PlainValidator(_number)]


class Table(BaseModel):
    """A TOML table: only the keys its fields name, each of its field's type."""

    model_config = ConfigDict(extra="forbid", strict=True)

    def given(self) -> dict[str, Any]:
        """The keys the table gave (not the defaults), as given."""
        return {k: getattr(self, k) for k in self.model_fields_set}


def problems(exc: ValidationError, root: type[BaseModel], prefix: str = "") -> list[str]:
    """One line per error in ``exc`` (from validating ``root``): the key's path under
    ``prefix`` (``events[2].limit_w``), pydantic's reason and, where it says something, the
    value given. A validator's own message that already starts with the path is kept as
    it is."""
    lines = []
    for err in exc.errors(include_url=False):
        where = prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
        where = where.removeprefix(".")
        msg = err["msg"].removeprefix("Value error, ")
        kind, value = err["type"], err.get("input")
        if kind == "extra_forbidden":
            known = list(_table_at(root, err["loc"][:-1]).model_fields)
            close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1, cutoff=0.6)
            msg = f"unknown key: did you mean {close[0]!r}?" if close else f"unknown key (known: {', '.join(known)})"
        elif kind == "model_type":
            msg = "must be a table"
        if kind not in ("missing", "value_error", "extra_forbidden") and not isinstance(value, dict):
            shown = repr(value)
            msg += f", got {shown if len(shown) <= MAX_SHOWN_VALUE else shown[:MAX_SHOWN_VALUE - 3] + '...'}"
        lines.append(msg if not where or msg.startswith(where) else f"{where}: {msg}")
    return lines


def _table_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel]:
    """The model of the table at ``loc`` under ``model`` (list indices skipped)."""
    for part in loc:
        if isinstance(part, str):
            model = _model_in(model.model_fields[part].annotation) or model
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model in a field's type (``list[PhaseTable] | None``: PhaseTable), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_model_in, typing.get_args(annotation)) if m is not None), None)


class Builds(Table):
    """A table that builds its object (:meth:`build`) as validation's last step, so that the
    object's own checks (a dataclass's ``__post_init__``) report at the table's path."""

    _built: Any = PrivateAttr(None)

    def build(self) -> Any:
        raise NotImplementedError

    @model_validator(mode="after")
    def _then_build(self) -> Self:
        self._built = self.build()
        return self

    @property
    def built(self) -> Any:
        return self._built


class Kinded(Builds):
    """A table whose first field (``kind``, ``action``) says which of the others it takes:
    KEYS maps a kind to (the keys it needs, the keys it may give); a key no kind names goes
    with any. The other fields default to None, so that a key left out is told apart."""

    model_config = ConfigDict(validate_default=True)  # a needed key left out is checked too
    KINDS: ClassVar[tuple[str, ...]]
    KEYS: ClassVar[dict[str, tuple[set[str], set[str]]]]

    @field_validator("*")
    @classmethod
    def _fits_kind(cls, value: Any, info: ValidationInfo) -> Any:
        kind_key, key = next(iter(cls.model_fields)), info.field_name
        if key == kind_key:
            if value not in cls.KINDS:
                raise ValueError(f"{value!r} is not one of {', '.join(cls.KINDS)}")
            return value
        kind = info.data.get(kind_key)  # absent when it was invalid: nothing to check against
        if kind is None or not any(key in needs | may for needs, may in cls.KEYS.values()):
            return value
        needs, may = cls.KEYS.get(kind, (set(), set()))
        if value is None and key in needs:
            raise ValueError(f"Field required for {kind_key} {kind!r}")
        if value is not None and key not in needs | may:
            raise ValueError(f"not a key of {kind_key} {kind!r}")
        return value
