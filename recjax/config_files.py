"""``--config`` beyond the built-in names: a Python file, a JSON or YAML file, a run's summary.json.

* ``NAME``: a named config of `recjax.configs` (``default``, ``smoke``, ``criteo``, ...).
* ``path.py``: a module defining ``config() -> Config`` or ``CONFIG`` (big_vision's config
  files: the docstring holds the command that runs it).
* ``path.json`` / ``path.yaml`` / ``path.yml``: nested sections, e.g.
  ``{"base": "criteo", "model": {"name": "deepfm"}, "train": {"epochs": 2}}``. ``base`` (optional)
  names the config the file starts from (default ``default``); every other key is a section whose
  fields are set exactly as ``--section.field=value`` sets them: the same type checks, the same
  refusal of unknown keys, plus the file's name in the message.
* a run's ``summary.json``: its ``config`` (the full resolved config, DESIGN.md section 3)
  reruns the run. ``train.out`` and ``train.resume`` are cleared (pass ``--out`` for the rerun:
  the old directory holds the old run's checkpoints), and so are ``train.stop_after`` and
  ``train.save_predictions`` (add ``--save-predictions`` with the new ``--out``);
  ``train.compile_cache`` goes back to ``auto``.

A file may set ``train.compile_cache`` to ``auto`` or ``off`` only: a directory there would
make JAX load and run compiled code from wherever the file points (a data file is not a place
to name one); ``--train.compile_cache=DIR`` on the command line still does.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import os
import typing
from typing import Any

from recjax import configs
from recjax.config import Config, ConfigError, _parse_value
from recjax.config_fields import is_text

FILE_KINDS = (".py", ".json", ".yaml", ".yml")
# A rerun from a summary must not write into (or resume) the run it reproduces.
RERUN_CLEARED = {"train": {"out": "", "resume": False, "stop_after": 0, "save_predictions": False,
                           "compile_cache": "auto"}}
# Keys a file may not point elsewhere: a compile cache directory holds native code that JAX
# loads and runs, so only the command line names one (a file may say auto or off).
FILE_CHOICES = {"train.compile_cache": ("auto", "off")}


def override_text(value: Any) -> str:
    """A typed value (from a file, or `recjax.fit`'s overrides) as the text
    ``--section.field=TEXT`` takes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(override_text(v) for v in value)
    return str(value)


def from_dict(tree: dict, where: str, base: Config | None = None) -> Config:
    """A `Config` from nested sections ``{section: {field: value}}`` on top of `base`.

    Args:
      tree: the parsed file; an optional ``base`` key names the starting config.
      where: the file, for error messages.
      base: the starting config when the tree names none (default: ``default``).

    Raises:
      ConfigError: ``WHERE: ...`` naming the bad key (unknown section or field, wrong type,
        a value the section refuses).
    """
    if not isinstance(tree, dict):
        raise ConfigError(f"{where}: expected a mapping of sections (e.g. {{\"train\": "
                          f"{{\"epochs\": 2}}}}), got {type(tree).__name__}")
    tree = dict(tree)
    name = tree.pop("base", None)
    try:
        cfg = configs.get(name) if name is not None else (base or configs.get("default"))
    except ValueError as e:
        raise ConfigError(f"{where}: key 'base': {e}") from None
    sections = {f.name for f in dataclasses.fields(cfg)}
    for section, fields in tree.items():
        if section not in sections:
            raise ConfigError(f"{where}: unknown section {section!r}; sections: "
                              f"{', '.join(sorted(sections))} (and 'base': a named config)")
        if not isinstance(fields, dict):
            raise ConfigError(f"{where}: section {section!r} must map fields to values, got "
                              f"{type(fields).__name__}")
        # One replace per section, so cross-field checks (__post_init__) see the file's whole
        # section, not a half-applied one (e.g. train.microbatches before train.batch_size).
        sub = getattr(cfg, section)
        hints = typing.get_type_hints(type(sub))
        names = [f.name for f in dataclasses.fields(sub)]
        values = {}
        for field, value in fields.items():
            key = f"{section}.{field}"
            if field not in names:
                close = difflib.get_close_matches(field, names, n=3)
                raise ConfigError(f"{where}: unknown config key {key!r}"
                                  + (f"; did you mean {[f'{section}.{c}' for c in close]}?"
                                     if close else f"; {section} has {', '.join(names)}"))
            if value is None:
                raise ConfigError(f"{where}: key {key!r} has no value (null); give one or remove "
                                  "the key")
            if is_text(hints[field]) and isinstance(value, bool):  # YAML 1.1: off, no, yes, on
                raise ConfigError(f"{where}: key {key!r} takes a string, and the file gave the "
                                  f"boolean {value!r} (YAML reads off/on/no/yes as booleans): "
                                  "quote it, e.g. 'off'")
            if key in FILE_CHOICES and value not in FILE_CHOICES[key]:
                raise ConfigError(f"{where}: key {key!r} may be {' or '.join(FILE_CHOICES[key])} "
                                  f"in a config file, not {value!r}: a compile cache directory "
                                  "holds native code that would be loaded and run; name one on "
                                  f"the command line (--{key}=DIR)")
            if isinstance(value, (list, tuple)):  # flattened silently before: [[64,[32]],16]
                if typing.get_origin(hints[field]) is not tuple:
                    raise ConfigError(f"{where}: key {key!r} takes one value, got a list "
                                      f"{value!r}")
                if any(isinstance(v, (list, tuple, dict)) for v in value):
                    raise ConfigError(f"{where}: key {key!r} takes a flat list, got the nested "
                                      f"{value!r}")
            try:
                values[field] = _parse_value(override_text(value), hints[field], key)
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from None
        try:
            cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(sub, **values)})
        except ValueError as e:
            raise ConfigError(f"{where}: section {section!r}: {e}") from None
    return cfg


def _load_py(path: str) -> Config:
    spec = importlib.util.spec_from_file_location(
        f"recjax_config_{abs(hash(os.path.abspath(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if callable(getattr(module, "config", None)):
        cfg = module.config()
    elif hasattr(module, "CONFIG"):
        cfg = module.CONFIG
    else:
        raise ConfigError(f"{path}: defines neither config() -> Config nor CONFIG; add one "
                          "(e.g. `def config(): return recjax.configs.smoke()`)")
    if not isinstance(cfg, Config):
        raise ConfigError(f"{path}: config()/CONFIG gave a {type(cfg).__name__}, not a "
                          "recjax.config.Config")
    return cfg


class _Refused(Exception):
    """A config file construct refused while parsing: ``(line, what)``."""


def _unique_keys(pairs: list, line: int | str = "") -> dict:
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise _Refused(line, f"key {k!r} is given twice in one mapping (the last would win "
                                 "silently); give it once")
        seen.add(k)
    return dict(pairs)


def _yaml_loader():
    """PyYAML's safe loader that refuses aliases (``*name``: 331 bytes of nested aliases
    expanded to a 4.2M-layer model) and keys given twice in one mapping."""
    import yaml

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise _Refused(mark.line + 1, "YAML aliases (*name) are not accepted in config "
                                              "files: write the value out")
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            keys = [(self.construct_object(k, deep=deep), None) for k, _ in node.value]
            _unique_keys(keys, node.start_mark.line + 1)
            return super().construct_mapping(node, deep)

    return Loader


def _load_tree(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        if path.endswith(".json"):
            try:
                return json.loads(text, object_pairs_hook=_unique_keys)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        import yaml  # only for YAML config files

        try:
            return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 (a safe loader)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}{line}: not valid YAML ({getattr(e, 'problem', e)})") from None
    except _Refused as e:
        line, what = e.args
        raise ConfigError(f"{path}{f':{line}' if line else ''}: {what}") from None


def load(name_or_path: str) -> Config:
    """``--config``: a named config, or a ``.py`` / ``.json`` / ``.yaml`` file, or a summary.json.

    Raises:
      ConfigError: unknown name, missing file, or a bad key in the file (file and key named).
    """
    if name_or_path in configs.CONFIGS:
        return configs.get(name_or_path)
    if not name_or_path.endswith(FILE_KINDS):
        raise ConfigError(f"--config {name_or_path!r} is neither a named config "
                          f"({', '.join(configs.CONFIGS)}) nor a config file "
                          f"({', '.join(FILE_KINDS)}, or a run's summary.json)")
    path = name_or_path
    if not os.path.isfile(path):
        raise ConfigError(f"--config {path}: no such file ({os.path.abspath(path)})")
    if path.endswith(".py"):
        return _load_py(path)
    tree = _load_tree(path)
    if isinstance(tree, dict) and isinstance(tree.get("config"), dict) and "algorithm" in tree:
        # a run's summary.json: its full config, minus what would write into that run
        sections = {k: dict(v, **RERUN_CLEARED.get(k, {})) for k, v in tree["config"].items()}
        return from_dict(sections, f"{path} (the run's config)", base=Config())
    return from_dict(tree, path)
