"""A config field's declaration is the one place its choices and its resumability are written
(recjax/config_fields.py): the checks, ``--help-config``, the override parser and the resume
contract read it."""

import dataclasses
from typing import Literal

import pytest

from recjax import config_fields, registry
from recjax.config import Config, ConfigError, _parse_value, override
from recjax.config_help import CHOICES, OPEN_CHOICES, help_text
from recjax.configs import default
from recjax.train import contract

# The hand-kept set recjax/train/contract.py held before the fields carried it (commit fad9f9e),
# copied here as the independent reference: marking a field RESUMABLE, or dropping a mark, fails.
RESUMABLE_BEFORE = {
    "train.steps", "train.epochs", "train.out", "train.resume", "train.log_every",
    "train.eval_every", "train.ckpt_every", "train.keep_ckpts", "train.progress",
    "train.save_predictions", "train.tensorboard", "train.stop_after", "train.eval_batch_size",
    "data.prefetch", "data.workers", "data.cache_dir", "data.cache_rows", "train.compile_cache",
    "train.early_stop_patience", "train.keep_best", "train.memory_check",
    "train.unverified_resume", "train.algo", "train.devices", "train.deterministic",
    "synthetic.eval_day",  # which day fresh eval examples are of: next-day eval (issue 36)
    # a day-by-day chain resumes each day with the next day's eval set (recjax/train/days.py)
    "data.eval_protocol", "data.eval_day"}


def test_resumable_changes_are_the_marked_fields_and_the_same_set_as_before():
    assert contract.RESUMABLE_CHANGES == RESUMABLE_BEFORE
    assert config_fields.resumable_keys(Config) == RESUMABLE_BEFORE


@dataclasses.dataclass(frozen=True)
class _Section:
    """A made-up section.

    Attributes:
      kind: a closed set.
      name: a closed set with a noun.
    """

    kind: Literal["a", "b"] = "a"
    name: Literal["x", "y"] = dataclasses.field(default="x", metadata={"unknown": "widget"})

    def __post_init__(self):
        config_fields.check_choices(self, "made")


def test_one_check_reads_the_annotation():
    assert config_fields.choices(_Section) == {"kind": ("a", "b"), "name": ("x", "y")}
    with pytest.raises(ValueError, match=r"^made\.kind must be one of a, b, got 'c'$"):
        _Section(kind="c")
    with pytest.raises(ValueError, match=r"^made\.name: unknown widget 'z'; choose one of x, y$"):
        _Section(name="z")
    _Section(kind="b", name="y")


def test_override_parser_takes_a_literal_as_text_and_the_check_refuses_the_rest():
    assert _parse_value("lru", Literal["fixed", "lru"], "embed.store") == "lru"
    assert override(default(), "embed.store", "lru").embed.store == "lru"
    with pytest.raises(ConfigError, match=r"embed\.store must be one of fixed, lru, got 'disk'"):
        override(default(), "embed.store", "disk")
    with pytest.raises(ConfigError, match=r"train\.algo: unknown algorithm 'nope'; choose one of "
                                          + ", ".join(registry.NAMES)):
        override(default(), "train.algo", "nope")


def test_help_lists_the_annotations_choices():
    text = help_text(default())
    for key, values in CHOICES.items():
        line = next(ln for ln in text.splitlines() if ln.startswith(f"  --{key}="))
        assert "choices: " + " | ".join(values) in line, line
    assert CHOICES["train.algo"] == registry.NAMES  # the registry's names, through the annotation
    assert set(OPEN_CHOICES) == {"train.compile_cache"}  # the one value that is not a closed set
    assert "(str; " in next(ln for ln in text.splitlines() if ln.startswith("  --embed.pooling="))


def test_the_hogwild_worker_count_is_one_property():
    cfg = override(override(default(), "runtime.trainers", "3"), "runtime.workers_per_trainer", "2")
    assert cfg.runtime.hogwild_workers == 6
