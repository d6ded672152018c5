"""Rule tables, mesh shapes and every bad SPMD configuration: a message before any compile."""

import pytest

from algorithms.train_main import main
from recjax.train import loop
from sharding import mesh, rules


def test_rules_first_match_wins():
    r = rules.parse_rules("emb/C1:table_wise; emb/.*:column_wise ;.*:data_parallel")
    kinds = rules.resolve(r, ["emb/C1", "emb/C2", "wide/C1"], "row_wise")
    assert kinds == {"emb/C1": "table_wise", "emb/C2": "column_wise", "wide/C1": "data_parallel"}
    assert rules.resolve((), ["emb/C1"], "row_wise") == {"emb/C1": "row_wise"}


@pytest.mark.parametrize("text,msg", [("emb/C1", "REGEX:TYPE"), ("emb/C1:sharded", "unknown sharding"),
                                      ("emb/(:row_wise", "bad regex")])
def test_bad_rules(text, msg):
    with pytest.raises(ValueError, match=msg):
        rules.parse_rules(text)


def test_mesh_shapes():
    assert mesh.mesh_shape("", ("data", "model"), 8, "data") == {"data": 8, "model": 1}
    assert mesh.mesh_shape("model=2,data=4", ("data", "model"), 8, "data") == {"data": 4, "model": 2}
    with pytest.raises(ValueError, match="unknown axis 'field'"):
        mesh.parse_mesh("field=2", ("data", "model"))


@pytest.mark.parametrize("args,msg", [
    (["--algo", "sync", "--mesh", "data=3,model=2"], "multiply to 6, but 8 devices"),
    (["--algo", "des", "--model", "fm", "--mesh", "data=4,field=4"], "multiply to 16, but 8 devices"),
    (["--algo", "sync", "--batch-size", "100"], "not divisible by the data axis"),
    (["--algo", "sync", "--spmd.table_rules=emb/C9:row_wise"], "name no table of this model"),
    (["--algo", "sync", "--mesh", "data=2,model=4", "--spmd.table_rules=wide/.*:column_wise",
      "--model", "deepfm"], "column_wise needs the embedding dim"),
    (["--algo", "des", "--model", "dlrm"], "no equivalent substitution for model 'dlrm'"),
    (["--algo", "des", "--model", "fm", "--spmd.des_placement=0,1"], "shard numbers"),
])
def test_bad_config_fails_before_compiling(args, msg, capsys, monkeypatch):
    def no_training(*a, **k):
        raise AssertionError("the trainer (and so JAX compilation) was reached")

    monkeypatch.setattr(loop, "run", no_training)
    rc = main(["--config", "smoke", "--devices", "8", "--steps", "1", "--no-progress"] + args)
    err = capsys.readouterr().err
    assert rc == 2 and msg in err, err
