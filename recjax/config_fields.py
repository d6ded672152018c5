"""What a config field's declaration says, read by one function each.

* **Choices.** A field whose values are a closed set is annotated with them,
  ``pooling: Literal["sum", "mean"] = "sum"`` (or ``Literal[POOLINGS]`` over a tuple constant
  that code elsewhere also reads). `check_choices`, called by every config section's
  ``__post_init__``, refuses a value outside the annotation; ``--help-config`` lists
  `choices`; the override parser (`recjax.config._parse_value`) reads such a field as text. So
  a choice is written once. A value that is not a closed set (``train.compile_cache``: auto |
  off | DIR) stays ``str`` and its help lives in `recjax.config_help.OPEN_CHOICES`.
* **Resumable.** ``dataclasses.field(default=..., metadata=RESUMABLE)`` marks a key a
  ``--resume`` may change (it does not alter the trajectory); `resumable_keys` collects them
  for `recjax.train.contract.RESUMABLE_CHANGES`.

This module imports nothing of recjax: the config sections of every module call it.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Literal

RESUMABLE = {"resumable": True}  # metadata: a --resume may change this field


def literal_values(typ) -> tuple | None:
    """The values of a ``Literal[...]`` annotation, or None for any other type."""
    return typing.get_args(typ) if typing.get_origin(typ) is Literal else None


def is_text(typ) -> bool:
    """Whether a field of annotation `typ` takes text: ``str`` or a ``Literal`` of strings."""
    values = literal_values(typ)
    return typ is str or (values is not None and all(isinstance(v, str) for v in values))


@functools.cache
def choices(cls) -> dict[str, tuple]:
    """``{field: allowed values}`` of the dataclass `cls`'s ``Literal``-annotated fields."""
    hints = typing.get_type_hints(cls)
    return {f.name: values for f in dataclasses.fields(cls)
            if (values := literal_values(hints[f.name])) is not None}


def check_choices(obj, section: str) -> None:
    """Refuse a field of `obj` (a config section named `section`) outside its ``Literal``.

    The message names the key, the value and the choices; a field with ``metadata={"unknown":
    NOUN}`` says "unknown NOUN" (``model.name: unknown model 'x'; choose one of ...``).

    Raises:
      ValueError: the first field, in declaration order, whose value is not one of its choices.
    """
    fields = {f.name: f for f in dataclasses.fields(obj)}
    for name, ok in choices(type(obj)).items():
        value = getattr(obj, name)
        if value in ok:
            continue
        listed = ", ".join(map(str, ok))
        noun = fields[name].metadata.get("unknown")
        if noun:
            raise ValueError(f"{section}.{name}: unknown {noun} {value!r}; choose one of {listed}")
        raise ValueError(f"{section}.{name} must be one of {listed}, got {value!r}")


def resumable_keys(config_cls) -> frozenset[str]:
    """``section.field`` of every field of `config_cls`'s sections marked `RESUMABLE`."""
    sections = typing.get_type_hints(config_cls)
    return frozenset(f"{s}.{f.name}" for s, cls in sections.items()
                     for f in dataclasses.fields(cls) if f.metadata.get("resumable"))
