"""``--config`` files (.py, .json, .yaml, a run's summary.json), sweeps and the runs table."""

import csv
import io
import json
import subprocess
import sys

import pytest

from algorithms.train_main import main
from recjax import cli, configs
from recjax.config import ConfigError
from recjax.config_files import load
from recjax.tools import collect
from tests.conftest import ROOT


def test_json_and_yaml_files_set_nested_sections_on_a_base(tmp_path):
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"base": "smoke", "model": {"name": "fm", "deep_mlp": [8, 4]},
                             "train": {"batch_size": 64, "microbatches": 4, "tensorboard": True}}))
    y = tmp_path / "c.yaml"
    y.write_text("base: smoke\nmodel:\n  name: fm\n  deep_mlp: [8, 4]\ntrain:\n  batch_size: 64\n"
                 "  microbatches: 4\n  tensorboard: true\n")
    expected = configs.smoke()
    for path in (j, y):
        cfg = load(str(path))
        assert (cfg.model.name, cfg.model.deep_mlp) == ("fm", (8, 4))
        # microbatches=4 is checked against the file's batch_size (64), not the base's 256
        assert (cfg.train.batch_size, cfg.train.microbatches, cfg.train.tensorboard) == (64, 4, True)
        assert cfg.synthetic == expected.synthetic and cfg.sparse == expected.sparse


def test_without_base_a_file_starts_from_default(tmp_path):
    p = tmp_path / "c.yml"
    p.write_text("train:\n  epochs: 5\n")
    cfg = load(str(p))
    assert cfg.train.epochs == 5 and cfg.model == configs.default().model


@pytest.mark.parametrize("text,msg", [
    ('{"train": {"epoch": 3}}', r"c\.json: unknown config key 'train.epoch'; did you mean \['train.epochs'"),
    ('{"trian": {"epochs": 3}}', r"c\.json: unknown section 'trian'"),
    ('{"train": {"epochs": "many"}}', r"c\.json: train.epochs='many': expected a value of type int"),
    ('{"train": {"epochs": 0}}', r"c\.json: section 'train': train.epochs must be >= 1"),
    ('{"train": {"epochs": null}}', r"key 'train.epochs' has no value"),
    ('{"base": "nope"}', r"key 'base': unknown --config 'nope'"),
    ('{"train": 3}', r"section 'train' must map fields to values"),
    ('{"train": {"epochs": 3,}}', r"c\.json:1: not valid JSON"),
])
def test_bad_keys_in_a_file_name_the_file_and_the_key(tmp_path, text, msg):
    p = tmp_path / "c.json"
    p.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        load(str(p))


@pytest.mark.parametrize("name,text,msg", [
    # issue 40 item 14: a 331-byte file of nested aliases expanded to a 4.2M-layer deep_mlp
    ("c.yaml", "a: &a [64, 64]\nb: &b [*a, *a]\nmodel: {name: dlrm}\n",
     r"c\.yaml:2: YAML aliases \(\*name\) are not accepted"),
    ("c.yaml", "model:\n  deep_mlp: [[64, [32]], 16]\n",
     r"key 'model.deep_mlp' takes a flat list, got the nested"),  # was flattened to 64,32,16
    ("c.yaml", "train:\n  steps: [[5]]\n", r"key 'train.steps' takes one value, got a list"),
    ("c.yaml", "train:\n  steps: 5\ntrain:\n  steps: 7\n",
     r"c\.yaml:1: key 'train' is given twice"),  # the last one won silently
    ("c.yaml", "train: {steps: 5, steps: 7}\n", r"key 'steps' is given twice"),
    ("c.json", '{"train": {"steps": 5}, "train": {"steps": 7}}', r"key 'train' is given twice"),
])
def test_ambiguous_files_are_refused(tmp_path, name, text, msg):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        load(str(p))


def test_a_yaml_anchor_without_alias_and_a_flat_list_are_fine(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: &m {name: deepfm, deep_mlp: [64, 32]}\n")
    assert load(str(p)).model.deep_mlp == (64, 32)


def test_bad_yaml_names_its_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  epochs: 3\n model: x\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:3: not valid YAML"):
        load(str(p))


def test_python_config_file_and_its_errors(tmp_path):
    p = tmp_path / "mine.py"
    p.write_text("import dataclasses\nfrom recjax import configs\n\ndef config():\n"
                 "    c = configs.smoke()\n"
                 "    return dataclasses.replace(c, train=dataclasses.replace(c.train, seed=7))\n")
    cfg, _ = cli.parse(["--config", str(p), "--epochs", "3"], "t")
    assert cfg.train.seed == 7 and cfg.train.epochs == 3 and cfg.synthetic.name == "smoke"
    q = tmp_path / "const.py"
    q.write_text("from recjax import configs\nCONFIG = configs.frappe()\n")
    assert load(str(q)) == configs.frappe()
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(ConfigError, match=r"bad\.py: defines neither config\(\) -> Config nor CONFIG"):
        load(str(bad))
    with pytest.raises(ConfigError, match="neither a named config"):
        load("smokey")
    with pytest.raises(ConfigError, match="no such file"):
        load(str(tmp_path / "none.yaml"))


def test_cli_reports_a_bad_file_as_a_message(tmp_path, capsys):
    p = tmp_path / "c.json"
    p.write_text('{"train": {"bach_size": 3}}')
    with pytest.raises(SystemExit):
        cli.parse(["--config", str(p)], "t")
    err = capsys.readouterr().err
    assert "c.json: unknown config key 'train.bach_size'" in err and "train.batch_size" in err


def test_rerun_from_summary_json_reproduces_the_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    args = ["--config", "smoke", "--model", "fm", "--steps", "6", "--seed", "3", "--no-progress"]
    assert main(args + ["--out", str(a), "--save-predictions"]) == 0
    cfg = load(str(a / "summary.json"))
    assert (cfg.train.out, cfg.train.resume, cfg.train.save_predictions) == ("", False, False)
    assert (cfg.model.name, cfg.train.steps, cfg.train.seed) == ("fm", 6, 3)
    assert main(["--config", str(a / "summary.json"), "--out", str(b), "--no-progress"]) == 0
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for k in ("steps", "train_ne", "eval_auc", "eval_logloss", "eval_ne"):
        assert sa[k] == sb[k], k
    ca, cb = sa["config"], sb["config"]
    ca["train"].update(out="", save_predictions=False)
    cb["train"].update(out="")
    assert ca == cb


def _summary(d, cfg_train, **metrics):
    d.mkdir(parents=True)
    cfg = json.loads(json.dumps(configs.smoke().to_dict()))
    cfg["train"].update(cfg_train)
    (d / "summary.json").write_text(json.dumps({"algorithm": "single", "config": cfg, **metrics}))


def test_collect_lists_differing_keys_and_metrics(tmp_path):
    _summary(tmp_path / "r1", {"seed": 1}, eval_auc=0.71234, eval_ne=0.9, steps=10)
    _summary(tmp_path / "r2", {"seed": 2}, eval_auc=0.7, eval_ne=None, steps=10)
    (tmp_path / "empty").mkdir()  # no summary.json: listed as skipped, not a row
    rows, skipped = collect.collect([str(p) for p in sorted(tmp_path.iterdir())])
    assert [r["run"] for r in rows] == ["r1", "r2"] and [p for p, _ in skipped] == [str(tmp_path / "empty")]
    cols = collect.columns(rows, keys=None)
    assert cols[:2] == ["run", "train.seed"] and "eval_auc" in cols and "model.name" not in cols
    text = collect.render(rows, cols, "csv")
    table = list(csv.DictReader(io.StringIO(text)))
    assert table[0]["train.seed"] == "1" and table[0]["eval_auc"] == "0.7123"
    assert table[1]["eval_ne"] == ""
    md = collect.render(rows, ["run", "eval_auc"], "md").splitlines()
    assert md[0] == "| run | eval_auc |" and md[2] == "| r1 | 0.7123 |"


@pytest.mark.slow
def test_sweep_runs_the_grid_and_skips_finished_points(tmp_path):
    out = tmp_path / "sw"
    cmd = [sys.executable, "scripts/sweep.py", "--config", "smoke", "--sweep", "dense.lr=0.01,0.1",
           "--sweep", "seed=1,2", "--out", str(out), "--", "--model", "lr", "--steps", "3",
           "--no-progress"]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    points = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert points == ["dense.lr=0.01_seed=1", "dense.lr=0.01_seed=2", "dense.lr=0.1_seed=1",
                      "dense.lr=0.1_seed=2"]
    assert first.stdout.count("eval_auc") == 4
    for p in points:
        s = json.loads((out / p / "summary.json").read_text())
        lr, seed = p.replace("dense.lr=", "").split("_seed=")
        assert s["config"]["dense"]["lr"] == float(lr) and s["config"]["train"]["seed"] == int(seed)
        assert s["steps"] == 3 and s["model"] == "lr"
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count("done already") == 4
    # issue 40 item 12: a damaged summary.json is not a finished point: moved aside, rerun
    damaged = out / points[0] / "summary.json"
    damaged.write_text(damaged.read_text()[:40])
    third = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0 and third.stdout.count("done already") == 3, third.stdout
    assert "not valid JSON" in third.stdout and json.loads(damaged.read_text())["steps"] == 3
    assert len(list((out / points[0]).glob("summary.json.damaged-*"))) == 1


def test_collect_skips_damaged_summaries_counts_and_names_them(tmp_path):
    """Issue 40 item 12: collect.py stopped with a traceback on an empty, partial, list-shaped
    or list-config summary.json and lost the whole table."""
    _summary(tmp_path / "good1", {"seed": 1}, eval_auc=0.71, steps=10)
    _summary(tmp_path / "good2", {"seed": 2}, eval_auc=0.72, steps=10)
    bad = {"empty": "", "partial": '{"steps": 10, "eval_a', "list": "[1, 2]",
           "listconfig": '{"steps": 10, "config": [1]}'}
    for name, text in bad.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(text)
    (tmp_path / "missing").mkdir()
    r = subprocess.run([sys.executable, "scripts/collect.py",
                        *sorted(str(p) for p in tmp_path.iterdir())],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| good1 |" in r.stdout and "| good2 |" in r.stdout
    for name in (*bad, "missing"):
        assert f"skipped {tmp_path / name}: " in r.stderr, name
    assert "5 of 7 paths skipped" in r.stderr


def test_help_config_lists_every_key_with_type_choices_and_description():
    import dataclasses

    from recjax.config import override
    from recjax.config_help import CHOICES, help_text

    cfg = configs.criteo()
    text = help_text(cfg)
    keys = [f"{s.name}.{f.name}" for s in dataclasses.fields(cfg)
            for f in dataclasses.fields(getattr(cfg, s.name))]
    blocks = {}
    for block in text.split("\n  --")[1:]:
        head, _, desc = block.partition("\n")
        blocks[head.split("=", 1)[0]] = (head, desc.strip())
    assert sorted(blocks) == sorted(keys)
    assert all(desc for _, desc in blocks.values()), [k for k, (_, d) in blocks.items() if not d]
    head, desc = blocks["model.name"]
    assert head.startswith("model.name='lr'  (str; default 'dlrm'; choices: lr | fm |")
    assert "model family" in desc
    assert blocks["data.hash_buckets"][0] == "data.hash_buckets=32768  (int; default 131072)"
    assert "(bool; true | false)" in blocks["train.resume"][0]
    # every listed choice is accepted, and a value outside them refused: the help cannot drift
    base = configs.default()
    for key, choices in CHOICES.items():
        for choice in choices:
            if choice != "DIR":
                override(base, key, choice)
        if key != "train.compile_cache":
            with pytest.raises(ConfigError):
                override(base, key, "no_such_choice")


def test_compile_cache_setting_and_flag():
    from recjax import compile_cache

    cfg, _ = cli.parse(["--no-compile-cache"], "t")
    assert cfg.train.compile_cache == "off" and compile_cache.directory("off") is None
    assert cli.parse([], "t")[0].train.compile_cache == "auto"
    assert compile_cache.directory("/x/y") == "/x/y"


def test_compile_cache_directory_follows_recjax_cache(monkeypatch, tmp_path):
    from recjax import compile_cache

    monkeypatch.setenv("RECJAX_CACHE", str(tmp_path))
    assert compile_cache.directory("auto") == str(tmp_path / "jax")
    monkeypatch.delenv("RECJAX_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.directory("auto") == str(tmp_path / "home" / ".cache" / "recjax" / "jax")


def test_a_process_keeps_the_first_compile_cache_it_was_given(tmp_path):
    """tests/conftest.py gave this process the tests' cache, every program written (or, with
    RECJAX_TEST_COMPILE_CACHE=off, an earlier test's `fit` the runs' cache); a `fit` in a test
    (`enable("auto")`) must neither move it nor change its minimum compile time."""
    import jax

    from recjax import compile_cache

    first = jax.config.jax_compilation_cache_dir
    least = jax.config.jax_persistent_cache_min_compile_time_secs
    if not first:
        pytest.skip("RECJAX_TEST_COMPILE_CACHE=off and no fit before: no cache in this process")
    assert compile_cache.enable(str(tmp_path / "other")) == first
    assert compile_cache.enable("auto") == first and compile_cache.enable("off") is None
    assert jax.config.jax_compilation_cache_dir == first and not (tmp_path / "other").exists()
    assert jax.config.jax_persistent_cache_min_compile_time_secs == least


@pytest.mark.slow
def test_second_run_loads_from_the_compile_cache_with_the_same_result(tmp_path):
    env = dict(__import__("os").environ, RECJAX_CACHE=str(tmp_path / "cache"))
    cmd = [sys.executable, "scripts/train.py", "--config", "smoke", "--steps", "5", "--no-progress",
           "--print-config"]
    runs = []
    for i in range(2):
        out = tmp_path / f"r{i}"
        r = subprocess.run(cmd[:-1] + ["--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        runs.append(json.loads((out / "summary.json").read_text()))
        if i == 0:
            entries = set((tmp_path / "cache" / "jax").iterdir())
            assert entries  # the first run wrote executables
    # the second run found them (it may add a few small ones that compiled slowly this time)
    assert entries <= set((tmp_path / "cache" / "jax").iterdir())
    assert runs[0]["eval_ne"] == runs[1]["eval_ne"] and runs[0]["train_ne"] == runs[1]["train_ne"]
    off = subprocess.run(cmd[:-1] + ["--out", str(tmp_path / "r2"), "--no-compile-cache"], cwd=ROOT,
                         env=dict(env, RECJAX_CACHE=str(tmp_path / "other")), capture_output=True,
                         text=True, timeout=600)
    assert off.returncode == 0 and not (tmp_path / "other").exists()


@pytest.mark.parametrize("name,text", [
    ("c.json", '{"train": {"compile_cache": "/tmp/elsewhere"}}'),
    ("c.yaml", "train: {compile_cache: /tmp/elsewhere}\n"),
])
def test_a_config_file_cannot_name_a_compile_cache_directory(tmp_path, name, text):
    """Issue 40 item 4: a file (or a summary.json rerun) made JAX write and load compiled code
    in any directory it named. A file may say auto or off; a rerun goes back to auto."""
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ConfigError, match=r"compile_cache' may be auto or off in a config file"):
        load(str(p))
    p.write_text(text.replace('"/tmp/elsewhere"', '"off"').replace("/tmp/elsewhere", '"off"'))
    assert load(str(p)).train.compile_cache == "off"
    if name.endswith(".yaml"):  # unquoted, YAML reads off as False (a directory 'false' before)
        p.write_text(text.replace("/tmp/elsewhere", "off"))
        with pytest.raises(ConfigError, match="quote it"):
            load(str(p))


def test_a_rerun_from_a_summary_does_not_keep_its_compile_cache_directory(tmp_path):
    cfg = json.loads(json.dumps(configs.smoke().to_dict()))
    cfg["train"]["compile_cache"] = "/tmp/elsewhere"
    (tmp_path / "summary.json").write_text(json.dumps({"algorithm": "single", "config": cfg}))
    assert load(str(tmp_path / "summary.json")).train.compile_cache == "auto"
