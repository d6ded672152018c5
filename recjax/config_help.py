"""``--help-config``: every key with its type, value, default, allowed choices and description.

The descriptions are the ``Attributes:`` sections of the config dataclasses' docstrings (the one
place they are written); the choices are the fields' ``Literal`` annotations, the same ones the
``__post_init__`` checks read (`recjax.config_fields`), so the help cannot drift from what is
accepted. ``train.algo``'s annotation is the registry's names (recjax/registry.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
import typing

from recjax import config as C
from recjax.config_fields import choices, literal_values

# The values of a field that are not a closed set, so no annotation can hold them.
OPEN_CHOICES: dict[str, tuple[str, ...]] = {"train.compile_cache": ("auto", "off", "DIR")}

# every key's choices: the annotations, then the open ones
CHOICES: dict[str, tuple[str, ...]] = {
    **{f"{s.name}.{k}": v for s in dataclasses.fields(C.Config)
       for k, v in choices(typing.get_type_hints(C.Config)[s.name]).items()},
    **OPEN_CHOICES}


def attribute_docs(cls) -> dict[str, str]:
    """``{field: description}`` from the ``Attributes:`` section of `cls`'s docstring."""
    doc = inspect.getdoc(cls) or ""
    if "Attributes:" not in doc:
        return {}
    block = doc.split("Attributes:", 1)[1]
    out: dict[str, str] = {}
    current, base = None, 0
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        m = re.match(r"\s*([A-Za-z_]\w*)(?:\s*\([^)]*\))?:\s*(.*)", line)
        if m and (current is None or indent <= base):
            base = indent
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif current is not None and indent > base:
            out[current] += " " + line.strip()
        else:
            break  # dedented past the attributes: another section
    return out


def _type_name(typ) -> str:
    if literal_values(typ) is not None:  # a closed set of strings: its choices are listed
        return "str"
    if typing.get_origin(typ) is tuple:
        return f"tuple[{typing.get_args(typ)[0].__name__}, ...] (comma-separated)"
    return getattr(typ, "__name__", str(typ))


def help_text(cfg, width: int = 100) -> str:
    """All keys of `cfg`, by section: ``--section.field=VALUE  (type; default ...; choices ...)``
    and the description, wrapped to `width`."""
    lines = []
    for s in dataclasses.fields(cfg):
        sub = getattr(cfg, s.name)
        cls = type(sub)
        summary = (inspect.getdoc(cls) or "").split("\n", 1)[0]
        lines.append(f"[{s.name}] {summary}")
        docs = attribute_docs(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(sub):
            key = f"{s.name}.{f.name}"
            value = getattr(sub, f.name)
            default = (f.default if f.default is not dataclasses.MISSING
                       else f.default_factory() if f.default_factory is not dataclasses.MISSING
                       else None)
            facts = [_type_name(hints[f.name])]
            if default != value:
                facts.append(f"default {default!r}")
            if key in CHOICES:
                facts.append("choices: " + " | ".join(CHOICES[key]))
            elif hints[f.name] is bool:
                facts.append("true | false")
            lines.append(f"  --{key}={value!r}  ({'; '.join(facts)})")
            if docs.get(f.name):
                lines.append(textwrap.fill(docs[f.name], width, initial_indent=" " * 6,
                                           subsequent_indent=" " * 6))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
