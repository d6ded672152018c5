"""--resume of a checkpoint written before a config field existed (issue 15's new fields)."""

import copy
import json

import pytest

from recjax.config import Config
from recjax.train.contract import check_resumable


def _dict(cfg: Config) -> dict:
    return json.loads(json.dumps(cfg.to_dict()))


def test_a_field_the_checkpoint_lacks_counts_as_its_default():
    now = defaults = _dict(Config())
    saved = copy.deepcopy(now)
    del saved["model"]["dropout"], saved["train"]["monitor"]  # written before they existed
    check_resumable(saved, now, defaults)  # the old run had the defaults' behaviour


def test_a_new_field_set_away_from_its_default_is_refused():
    defaults = _dict(Config())
    now = copy.deepcopy(defaults)
    now["model"]["dropout"] = 0.2
    saved = copy.deepcopy(defaults)
    del saved["model"]["dropout"]
    with pytest.raises(ValueError, match=r"model\.dropout: checkpoint 0\.0, now 0\.2"):
        check_resumable(saved, now, defaults)


def test_early_stopping_settings_may_change_on_resume_but_not_the_monitor():
    defaults = _dict(Config())
    now = copy.deepcopy(defaults)
    now["train"].update(early_stop_patience=3, keep_best=True)
    check_resumable(defaults, now, defaults)
    now["train"]["monitor"] = "eval_ne"  # out/best holds the best of the old monitor
    with pytest.raises(ValueError, match=r"train\.monitor: checkpoint 'eval_auc', now 'eval_ne'"):
        check_resumable(defaults, now, defaults)


@pytest.mark.parametrize("key,value", [("holdout", 0.5), ("split_seed", 7),
                                       ("eval", "frappe:OTHER")])
def test_a_new_eval_set_or_hold_out_split_is_refused(key, value):
    """Issue 40 item 2: a new split puts trained rows into the eval set (and eval rows into
    training); a new eval file changes what is evaluated, and what is held out of training."""
    defaults = _dict(Config())
    now = copy.deepcopy(defaults)
    now["data"][key] = value
    with pytest.raises(ValueError, match=rf"data\.{key}: checkpoint .*, now {value!r}"):
        check_resumable(defaults, now, defaults)
