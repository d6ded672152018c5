"""DCN-v2 and DIN against peer libraries: DeepCTR-Torch 0.3.0 (``DCN`` with the matrix cross
layer, ``DIN``) and TorchRec 1.9.2 (``CrossNet``, ``LowRankCrossNet``,
``LowRankMixtureCrossNet``), with the same weights and the same batch from the Criteo and
Taobao samples: the logits, the loss, and every parameter and embedding table after one step of
SGD, Adagrad and Adam, all in float64. BST has no peer built as it is; its transformer block is
checked against ``torch.nn.TransformerEncoderLayer`` (the last test says why).

recjax's side is its own train step (`recjax.train.step.train_step`: lookup, model, dense optax
optimizer, sparse table optimizer) run under ``jax.enable_x64``; the peer's side is the peer's
module with recjax's weights copied in, the BCE-with-logits mean loss and ``torch.optim`` (one
optimizer for the dense parameters, one for the tables, as recjax splits them; nn.Embedding's
dense gradient is zero on untouched rows, which SGD, Adagrad and Adam then leave unchanged, so
one dense torch step equals recjax's sparse step on the touched rows).

Where the peer differs by design, it is made to match by configuration, else the difference is
tested around (docs/models.md, "Checked against peers"):

* DeepCTR's prediction layer applies a sigmoid: its ``task`` is set to ``regression`` so it
  returns the logit (its bias kept); its linear part gets no feature columns (zero).
* DeepCTR's activation unit reads ``[q, k, q - k, q * k]``, recjax's ``[k, q, k - q, k * q]``:
  the first kernel's row blocks are swapped and the third negated (an exact reparametrisation,
  and SGD, Adagrad and Adam are all elementwise and odd in the gradient, so it holds after a
  step too); its ``prelu`` is one slope per layer, recjax's one per unit: DeepCTR's PReLU layers
  are replaced by ``nn.PReLU(width)``.
* TorchRec's (and DeepCTR's) mixture has one gate per expert shared by all layers, recjax one per
  layer and expert: one layer is compared exactly, two layers with recjax's gates tied, where
  the peer's SGD step on its gate is the sum of recjax's per-layer steps.
* optax's dense Adagrad has its eps inside the root, torch's outside: the check sets the dense
  eps to 0 in both (the accumulator starts at 0.1, so nothing divides by 0).

Run with the test-only extra: ``make test-peer`` (requirements-peer.txt, a separate virtual
environment). Without torch the module is skipped.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recjax import configs
from recjax.batch import Batch
from recjax.config import DenseOptimConfig
from recjax.data.sources import open_source
from recjax.embeddings import SparseOptimConfig
from recjax.models import ModelConfig
from recjax.models.sequence import sequences
from recjax.train.setup import build
from recjax.train.step import TrainState, predict, train_step
from tests.conftest import data_path

torch = pytest.importorskip(
    "torch", reason="peer check: torch is in the test-only extra (requirements-peer.txt, "
    "`make test-peer`), never a dependency of recjax")

# float64 on both sides: what is left is summation order, ~1e-16 relative per operation
RTOL, ATOL = 1e-10, 1e-12
D = 4  # embedding width
BUCKETS = 1000  # hash buckets per field: small tables, so a batch touches some rows twice

OPTIMIZERS = {  # recjax dense, recjax sparse, torch (class, dense kwargs, table kwargs)
    "sgd": (DenseOptimConfig(name="sgd", lr=0.05), SparseOptimConfig(name="sgd", lr=0.05),
            ("SGD", dict(lr=0.05), dict(lr=0.05))),
    "adagrad": (DenseOptimConfig(name="adagrad", lr=0.05, eps=0.0),
                SparseOptimConfig(name="adagrad", lr=0.05, eps=1e-8),
                ("Adagrad", dict(lr=0.05, initial_accumulator_value=0.1, eps=0.0),
                 dict(lr=0.05, initial_accumulator_value=0.0, eps=1e-8))),
    "adam": (DenseOptimConfig(name="adam", lr=0.01, b1=0.9, b2=0.999, eps=1e-8),
             SparseOptimConfig(name="adam", lr=0.01, b1=0.9, b2=0.999, eps=1e-8),
             ("Adam", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8),
              dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8))),
}

_BATCHES = {}


def _batch(kind: str):
    """The first rows of a real sample as (spec, Batch in float64)."""
    if kind not in _BATCHES:
        if kind == "criteo":
            path, rows, spec_kind = data_path("criteo_kaggle_8k", "train.tsv"), 48, "criteo"
        else:
            path, rows = data_path("taobao_ad_tiny", "train_sample.csv"), 64
            spec_kind = "seq:taobao"
        src = open_source(f"{spec_kind}:{path}", hash_buckets=BUCKETS, chunk_rows=rows,
                          multi_hot_len=6)
        c = next(iter(src.chunks()))
        assert c.label.min() < c.label.max(), "a batch of one label checks little"
        _BATCHES[kind] = (src.spec, Batch(c.dense.astype(np.float64), c.ids, c.mask,
                                          c.label.astype(np.float64)))
    return _BATCHES[kind]


def _random_like(tree, rng):
    """Every parameter drawn afresh (biases and slopes too: a zero bias would hide a wrong
    bias term); matrices at 1/sqrt(their larger side), vectors at 0.3."""
    def draw(x):  # an array or a jax.ShapeDtypeStruct
        shape = tuple(x.shape)
        scale = max(shape[-2:]) ** -0.5 if len(shape) >= 2 else 0.3
        return rng.normal(size=shape) * scale
    return jax.tree.map(draw, tree)


def recjax_step(model_cfg: ModelConfig, kind: str, opt: str, seed: int = 0, edit=None):
    """recjax's float64 logits, loss, and parameters and tables before and after one step.

    Args:
      edit: optional ``params -> params`` applied to the drawn parameters (tying gates).
    """
    spec, batch = _batch(kind)
    dense, sparse, _ = OPTIMIZERS[opt]
    cfg = dataclasses.replace(configs.smoke(), model=model_cfg, dense=dense, sparse=sparse)
    model, tx, sopt, state = build(cfg, spec)
    rng = np.random.default_rng(seed)
    params = _random_like(state.params, rng)
    if edit is not None:
        params = edit(params)
    tables = {k: 0.5 * rng.normal(size=v.shape) for k, v in state.tables.items()}
    with jax.enable_x64(True):
        p64 = jax.tree.map(jnp.asarray, params)
        t64 = {k: jnp.asarray(v) for k, v in tables.items()}
        st = TrainState(jnp.zeros((), jnp.int32), p64, tx.init(p64), t64,
                        {k: sopt.init(v) for k, v in t64.items()}, ())
        assert all(x.dtype == jnp.float64 for x in jax.tree.leaves((p64, t64)))
        logits = np.asarray(predict(model, p64, t64, batch))
        new, m = train_step(model, tx, sopt, st, batch)
        after = jax.tree.map(np.asarray, (new.params, new.tables))
    return dict(spec=spec, batch=batch, params=params, tables=tables, logits=logits,
                loss=float(m.loss), new_params=after[0], new_tables=after[1])


def torch_step(module, dense_params, table_params, forward, label, opt: str):
    """The peer's float64 logits and loss, then one step of `opt` on its parameters."""
    name, dense_kw, table_kw = OPTIMIZERS[opt][2]
    logits = forward()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(label))
    loss.backward()
    for group, kw in ((dense_params, dense_kw), (table_params, table_kw)):
        getattr(torch.optim, name)(group, **kw).step()
    return logits.detach().numpy(), loss.item()


def _t(x) -> "torch.nn.Parameter":
    return torch.nn.Parameter(torch.tensor(np.asarray(x, np.float64)))


def _np(p) -> np.ndarray:
    return p.detach().numpy()


def assert_same(got_logits, got_loss, got_params, got_tables, ref) -> dict:
    """The peer's logits, loss, parameters (recjax's tree) and tables equal recjax's; returns
    the largest absolute differences (before the step: logits and loss; after: the rest)."""
    np.testing.assert_allclose(got_logits, ref["logits"], rtol=RTOL, atol=ATOL)
    assert got_loss == pytest.approx(ref["loss"], rel=RTOL, abs=ATOL)
    diffs = {"logits": np.abs(got_logits - ref["logits"]).max(),
             "loss": abs(got_loss - ref["loss"])}
    want = dict(jax.tree_util.tree_leaves_with_path(ref["new_params"]))
    got = dict(jax.tree_util.tree_leaves_with_path(got_params))
    assert got.keys() == want.keys()
    moved = 0.0
    for path, w in want.items():
        np.testing.assert_allclose(got[path], w, rtol=RTOL, atol=ATOL,
                                   err_msg=jax.tree_util.keystr(path))
        diffs["params"] = max(diffs.get("params", 0.0), np.abs(got[path] - w).max())
    for k, w in ref["new_tables"].items():
        np.testing.assert_allclose(got_tables[k], w, rtol=RTOL, atol=ATOL, err_msg=k)
        diffs["tables"] = max(diffs.get("tables", 0.0), np.abs(got_tables[k] - w).max())
        moved = max(moved, np.abs(w - ref["tables"][k]).max())
    assert moved > 1e-4, "the step must move the tables, or comparing them checks nothing"
    print({k: f"{v:.1e}" for k, v in diffs.items()})  # the numbers docs/models.md quotes
    return diffs


# --- DCN-v2 ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def deepctr():
    pytest.importorskip("sklearn", reason="deepctr-torch imports scikit-learn (requirements-peer)")
    return pytest.importorskip("deepctr_torch", reason="peer check: deepctr-torch is in the "
                               "test-only extra (requirements-peer.txt, `make test-peer`)")


def _deepctr_columns(spec, skip=(), hist=None):
    from deepctr_torch.inputs import DenseFeat, SparseFeat, VarLenSparseFeat

    cols = [SparseFeat(f.name, f.vocab_size, embedding_dim=D, embedding_name=f.table)
            for i, f in enumerate(spec.fields) if i not in skip]
    if hist is not None:  # (name, table, vocab, L)
        name, table, vocab, length = hist
        cols.append(VarLenSparseFeat(SparseFeat(name, vocab, embedding_dim=D,
                                                embedding_name=table), maxlen=length,
                                     length_name="seq_length"))
    return cols + [DenseFeat(n, 1) for n in spec.dense_names]


def _deepctr_ready(model):
    """float64, and logits instead of probabilities (the prediction layer's sigmoid off)."""
    model.double()
    model.out.task = "regression"
    return model


def _tables_of(model, prefix="emb/"):
    return {f"{prefix}{k}": _np(e.weight) for k, e in model.embedding_dict.items()}


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_dcn_v2_full_rank_parallel_equals_deepctr_dcn_matrix(deepctr, opt):
    """recjax's ``dcn_v2`` (full-rank W, Eq. 1; parallel with a deep tower) against DeepCTR's
    ``DCN(cross_parameterization="matrix")``, on 48 Criteo rows, tables included."""
    from deepctr_torch.models import DCN

    cfg = ModelConfig(name="dcn_v2", embed_dim=D, deep_mlp=(16, 8), cross_layers=2,
                      cross_rank=0, cross_structure="parallel")
    ref = recjax_step(cfg, "criteo", opt)
    spec, batch, p = ref["spec"], ref["batch"], ref["params"]
    model = _deepctr_ready(DCN([], _deepctr_columns(spec), cross_num=2,
                               cross_parameterization="matrix", dnn_hidden_units=(16, 8),
                               l2_reg_linear=0, l2_reg_embedding=0, l2_reg_cross=0,
                               dnn_dropout=0, task="binary"))
    with torch.no_grad():
        for k, e in model.embedding_dict.items():
            e.weight.copy_(torch.tensor(ref["tables"][f"emb/{k}"]))
        for layer in range(2):
            model.crossnet.kernels[layer].copy_(torch.tensor(p["cross_w"][layer]))
            model.crossnet.bias[layer].copy_(torch.tensor(p["cross_b"][layer][:, None]))
        for i, lin in enumerate(model.dnn.linears):
            lin.weight.copy_(torch.tensor(p["deep"][f"layer_{i}"]["kernel"].T))
            lin.bias.copy_(torch.tensor(p["deep"][f"layer_{i}"]["bias"]))
        model.dnn_linear.weight.copy_(torch.tensor(p["out"]["kernel"].T))
        model.out.bias.copy_(torch.tensor(p["out"]["bias"]))
    x = torch.tensor(np.concatenate([batch.ids[:, :, 0], batch.dense], 1).astype(np.float64))
    dense = [model.crossnet.kernels, model.crossnet.bias, *model.dnn.parameters(),
             model.dnn_linear.weight, model.out.bias]
    logits, loss = torch_step(model, dense, list(model.embedding_dict.parameters()),
                              lambda: model(x)[:, 0], batch.label, opt)
    got = {"cross_b": _np(model.crossnet.bias)[:, :, 0], "cross_w": _np(model.crossnet.kernels),
           "deep": {f"layer_{i}": {"bias": _np(lin.bias), "kernel": _np(lin.weight).T}
                    for i, lin in enumerate(model.dnn.linears)},
           "out": {"bias": _np(model.out.bias), "kernel": _np(model.dnn_linear.weight).T}}
    assert_same(logits, loss, got, _tables_of(model), ref)


class CrossTower(torch.nn.Module):
    """A TorchRec cross network in recjax's dcn_v2 layout: tables -> x0 = [flatten(emb), dense]
    -> cross -> (stacked: MLP(x_L); parallel: [x_L, MLP(x0)]) -> Linear(1). The glue is
    plain torch; the cross network is TorchRec's."""

    def __init__(self, spec, cross, deep, structure):
        super().__init__()
        self.field_tables = [f.table for f in spec.fields]
        self.tables = torch.nn.ModuleDict({f.table: torch.nn.Embedding(f.vocab_size, D)
                                           for f in spec.fields})
        k = spec.n_fields * D + spec.n_dense
        self.cross, self.structure = cross, structure
        widths = (k, *deep)
        self.deep = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        top = k if not deep else deep[-1] + (k if structure == "parallel" else 0)
        self.out = torch.nn.Linear(top, 1)

    def forward(self, ids, dense):
        emb = torch.stack([self.tables[t](ids[:, i]) for i, t in enumerate(self.field_tables)], 1)
        x0 = torch.cat([emb.flatten(1), dense], 1)
        x = self.cross(x0)
        if len(self.deep):
            h = x if self.structure == "stacked" else x0
            for lin in self.deep:
                h = torch.relu(lin(h))
            x = h if self.structure == "stacked" else torch.cat([x, h], 1)
        return self.out(x)[:, 0]


@pytest.fixture(scope="module")
def crossnet():
    pytest.importorskip("torchrec", reason="peer check: torchrec (with fbgemm-gpu-cpu) is in the "
                        "test-only extra (requirements-peer.txt, `make test-peer`)")
    from torchrec.modules import crossnet
    return crossnet


CROSS_CASES = {  # rank, experts, layers, structure, deep
    "full-stacked": (0, 1, 2, "stacked", (16, 8)),
    "low-rank-stacked": (3, 1, 2, "stacked", (16,)),
    "low-rank-parallel": (3, 1, 2, "parallel", (16, 8)),
    "mixture-parallel": (2, 3, 1, "parallel", (16, 8)),
    "mixture-alone": (2, 3, 1, "parallel", ()),
}


def _tie_gates(params):
    """Every layer's gates set to layer 0's: TorchRec shares one set across layers."""
    g = params["cross_gate"]
    return {**params, "cross_gate": np.broadcast_to(g[:1], g.shape).copy()}


def _torchrec_tower(crossnet, spec, rank, experts, layers, structure, deep, ref):
    """The TorchRec module for a case, recjax's weights copied in; returns it and a function
    reading its parameters back in recjax's tree."""
    k = spec.n_fields * D + spec.n_dense
    p = ref["params"]
    if rank == 0:
        cross = crossnet.CrossNet(k, layers)
    elif experts == 1:
        cross = crossnet.LowRankCrossNet(k, layers, low_rank=rank)
    else:
        cross = crossnet.LowRankMixtureCrossNet(k, layers, num_experts=experts, low_rank=rank,
                                                activation=torch.relu)
    tower = CrossTower(spec, cross, deep, structure).double()
    with torch.no_grad():
        for name, e in tower.tables.items():
            e.weight.copy_(torch.tensor(ref["tables"][f"emb/{name}"]))
        for layer in range(layers):
            b = p["cross_b"][layer]
            if rank == 0:
                cross.kernels[layer].copy_(torch.tensor(p["cross_w"][layer]))
                cross.bias[layer].copy_(torch.tensor(b[:, None]))
            elif experts == 1:
                cross.W_kernels[layer].copy_(torch.tensor(p["cross_u"][layer, 0]))
                cross.V_kernels[layer].copy_(torch.tensor(p["cross_v"][layer, 0].T))
                cross.bias[layer].copy_(torch.tensor(b))
            else:
                cross.U_kernels[layer].copy_(torch.tensor(p["cross_u"][layer]))
                cross.V_kernels[layer].copy_(torch.tensor(p["cross_v"][layer].transpose(0, 2, 1)))
                cross.C_kernels[layer].copy_(torch.tensor(p["cross_c"][layer]))
                cross.bias[layer].copy_(torch.tensor(b[:, None]))
        if experts > 1:
            for i, gate in enumerate(cross.gates):
                gate.weight.copy_(torch.tensor(p["cross_gate"][0, i][None]))
        for i, lin in enumerate(tower.deep):
            lin.weight.copy_(torch.tensor(p["deep"][f"layer_{i}"]["kernel"].T))
            lin.bias.copy_(torch.tensor(p["deep"][f"layer_{i}"]["bias"]))
        tower.out.weight.copy_(torch.tensor(p["out"]["kernel"].T))
        tower.out.bias.copy_(torch.tensor(p["out"]["bias"]))

    def read():
        out = {"out": {"bias": _np(tower.out.bias), "kernel": _np(tower.out.weight).T}}
        if deep:
            out["deep"] = {f"layer_{i}": {"bias": _np(lin.bias), "kernel": _np(lin.weight).T}
                           for i, lin in enumerate(tower.deep)}
        stack = lambda ps: np.stack([_np(q) for q in ps])  # noqa: E731
        if rank == 0:
            out |= {"cross_w": stack(cross.kernels), "cross_b": stack(cross.bias)[:, :, 0]}
        elif experts == 1:
            out |= {"cross_u": stack(cross.W_kernels)[:, None],
                    "cross_v": stack(cross.V_kernels).transpose(0, 2, 1)[:, None],
                    "cross_b": stack(cross.bias)}
        else:
            gate = np.stack([_np(g.weight)[0] for g in cross.gates])
            out |= {"cross_u": stack(cross.U_kernels),
                    "cross_v": stack(cross.V_kernels).transpose(0, 1, 3, 2),
                    "cross_c": stack(cross.C_kernels), "cross_b": stack(cross.bias)[:, :, 0],
                    "cross_gate": np.broadcast_to(gate, (layers, *gate.shape))}
        return out

    return tower, read


def _run_tower(tower, ref, opt):
    batch = ref["batch"]
    ids = torch.tensor(batch.ids[:, :, 0].astype(np.int64))
    dense = torch.tensor(batch.dense)
    tables = list(tower.tables.parameters())
    others = [q for n, q in tower.named_parameters() if not n.startswith("tables.")]
    return torch_step(tower, others, tables, lambda: tower(ids, dense), batch.label, opt)


@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("case", CROSS_CASES)
def test_dcn_v2_equals_torchrec_crossnets(crossnet, case, opt):
    """Full rank = TorchRec ``CrossNet``, low rank = ``LowRankCrossNet``, a mixture of low-rank
    experts = ``LowRankMixtureCrossNet`` (ReLU), one layer (the peer's gates are shared by its
    layers, recjax's per layer: see the next test), on 48 Criteo rows, tables included."""
    rank, experts, layers, structure, deep = CROSS_CASES[case]
    cfg = ModelConfig(name="dcn_v2", embed_dim=D, deep_mlp=deep, cross_layers=layers,
                      cross_rank=rank, cross_experts=experts, cross_structure=structure)
    ref = recjax_step(cfg, "criteo", opt, seed=1)
    tower, read = _torchrec_tower(crossnet, ref["spec"], *CROSS_CASES[case], ref)
    logits, loss = _run_tower(tower, ref, opt)
    assert_same(logits, loss, read(), {f"emb/{k}": _np(e.weight)
                                       for k, e in tower.tables.items()}, ref)


def test_dcn_v2_mixture_two_layers_with_tied_gates_equals_torchrec(crossnet):
    """Two mixture layers, recjax's per-layer gates tied to one set (TorchRec's layout): the
    same logits, and after an SGD step every parameter agrees, the peer's shared gate having
    moved by the sum of recjax's per-layer moves."""
    cfg = ModelConfig(name="dcn_v2", embed_dim=D, deep_mlp=(16,), cross_layers=2,
                      cross_rank=2, cross_experts=3, cross_structure="stacked")
    ref = recjax_step(cfg, "criteo", "sgd", seed=2, edit=_tie_gates)
    tower, read = _torchrec_tower(crossnet, ref["spec"], 2, 3, 2, "stacked", (16,), ref)
    logits, loss = _run_tower(tower, ref, "sgd")
    got = read()
    g0 = ref["params"]["cross_gate"]
    moves = ref["new_params"]["cross_gate"] - g0  # [L, E, K], one per layer
    assert np.abs(moves[0] - moves[1]).max() > 1e-6, "the layers' gates must move differently"
    np.testing.assert_allclose(got["cross_gate"][0] - g0[0], moves.sum(0), rtol=RTOL, atol=ATOL)
    got["cross_gate"] = ref["new_params"]["cross_gate"]  # checked just above
    assert_same(logits, loss, got, {f"emb/{k}": _np(e.weight) for k, e in tower.tables.items()},
                ref)


# --- DIN ---------------------------------------------------------------------------------

class UnitPReLU(torch.nn.PReLU):
    """torch's PReLU with one slope per unit of the last axis (nn.PReLU's channel axis is 1,
    the unit's input is [B, T, units])."""

    def forward(self, x):
        return super().forward(x.transpose(1, -1)).transpose(1, -1)


@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("att_mlp", [(5,), (6, 3)])
def test_din_equals_deepctr_din(deepctr, att_mlp, opt):
    """recjax's ``din`` (attention pooling, Eq. 3, no softmax) against DeepCTR's ``DIN``
    (``att_weight_normalization=False``, PReLU per unit) on 64 Taobao rows whose click
    sequences (0 to 6 long) are padded: every field's table, the shared adgroup_id table included,
    and DeepCTR's length mask standing for recjax's zero padding."""
    from deepctr_torch.models import DIN

    cfg = ModelConfig(name="din", embed_dim=D, att_mlp=att_mlp, deep_mlp=(8, 4))
    ref = recjax_step(cfg, "taobao", opt, seed=3)
    spec, batch, p = ref["spec"], ref["batch"], ref["params"]
    (seq,) = sequences(spec)
    target = spec.fields[seq.target]
    length = len(seq.positions)
    lens = batch.mask[:, seq.positions, 0].sum(1)
    assert lens.min() == 0 and lens.max() == length, "empty, padded and full sequences all occur"
    hist = f"hist_{target.name}"
    cols = _deepctr_columns(spec, skip=set(seq.positions),
                            hist=(hist, target.table, target.vocab_size, length))
    model = _deepctr_ready(DIN(cols, [target.name], dnn_hidden_units=(8, 4),
                               att_hidden_size=att_mlp, att_activation="prelu",
                               att_weight_normalization=False, l2_reg_embedding=0,
                               dnn_dropout=0, task="binary"))
    unit = model.attention.local_att
    unit.dnn.activation_layers = torch.nn.ModuleList(  # one slope per unit, as recjax's
        UnitPReLU(w) for w in att_mlp).double()
    k = D  # one sequence: a behaviour is D wide
    perm = lambda w: np.concatenate([w[k:2 * k], w[:k], -w[2 * k:3 * k], w[3 * k:]])  # noqa: E731
    with torch.no_grad():
        for name, e in model.embedding_dict.items():
            e.weight.copy_(torch.tensor(ref["tables"][f"emb/{name}"]))
        for i, lin in enumerate(unit.dnn.linears):
            kern = p["att"][f"layer_{i}"]["kernel"]
            lin.weight.copy_(torch.tensor((perm(kern) if i == 0 else kern).T))
            lin.bias.copy_(torch.tensor(p["att"][f"layer_{i}"]["bias"]))
            unit.dnn.activation_layers[i].weight.copy_(torch.tensor(p["att"][f"prelu_{i}"]))
        last = len(att_mlp)
        unit.dense.weight.copy_(torch.tensor(p["att"][f"layer_{last}"]["kernel"].T))
        unit.dense.bias.copy_(torch.tensor(p["att"][f"layer_{last}"]["bias"]))
        for i, lin in enumerate(model.dnn.linears):
            lin.weight.copy_(torch.tensor(p["deep"][f"layer_{i}"]["kernel"].T))
            lin.bias.copy_(torch.tensor(p["deep"][f"layer_{i}"]["bias"]))
        model.dnn_linear.weight.copy_(torch.tensor(p["out"]["kernel"].T))
        model.out.bias.copy_(torch.tensor(p["out"]["bias"]))
    other = [i for i in range(spec.n_fields) if i not in seq.positions]
    x = torch.tensor(np.concatenate([batch.ids[:, other, 0], batch.ids[:, seq.positions, 0],
                                     lens[:, None], batch.dense], 1).astype(np.float64))
    tables = list(model.embedding_dict.parameters())
    dense = [*unit.parameters(), *model.dnn.parameters(), model.dnn_linear.weight,
             model.out.bias]
    logits, loss = torch_step(model, dense, tables, lambda: model(x)[:, 0], batch.label, opt)
    att = {f"layer_{i}": {"bias": _np(lin.bias),
                          "kernel": (perm(_np(lin.weight).T) if i == 0 else _np(lin.weight).T)}
           for i, lin in enumerate(unit.dnn.linears)}
    att[f"layer_{last}"] = {"bias": _np(unit.dense.bias), "kernel": _np(unit.dense.weight).T}
    att |= {f"prelu_{i}": _np(a.weight) for i, a in enumerate(unit.dnn.activation_layers)}
    got = {"att": att,
           "deep": {f"layer_{i}": {"bias": _np(lin.bias), "kernel": _np(lin.weight).T}
                    for i, lin in enumerate(model.dnn.linears)},
           "out": {"bias": _np(model.out.bias), "kernel": _np(model.dnn_linear.weight).T}}
    assert_same(logits, loss, got, _tables_of(model), ref)


# --- BST ---------------------------------------------------------------------------------

@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_bst_block_equals_torch_transformer_encoder_layer(opt):
    """No peer library builds BST as recjax does (torch-rechub's BST adds the position
    embedding instead of concatenating it, puts the target last and feeds only its output to
    the tower; DeepCTR-Torch and TorchRec have none), so its transformer block (Eq. 1-5) is
    checked against the layer torch-rechub's BST is made of, ``torch.nn.TransformerEncoderLayer``
    (post-norm, LeakyReLU, eps 1e-5), with its attention biases, which recjax has not, held at 0
    (zero and frozen): tokens whose key padding follows the Taobao sample's click sequences,
    forward, and the block's parameters after one step of each optimizer, in float64."""
    from recjax.models.bst import LEAKY_SLOPE, LN_EPS, Block
    from recjax.train.setup import make_dense_tx

    spec, batch = _batch("taobao")
    (seq,) = sequences(spec)
    valid = np.concatenate([np.ones((batch.size, 1), bool),
                            batch.mask[:, seq.positions, 0] > 0], 1)  # target, then behaviours
    b, t, d, heads, ffn = batch.size, valid.shape[1], 8, 2, 12
    rng = np.random.default_rng(4)
    x = rng.normal(size=(b, t, d))
    readout = rng.normal(size=(b, t, d))  # loss = sum(out * readout) / B: every output counts
    block = Block(heads, ffn)
    with jax.enable_x64(True):
        shapes = jax.eval_shape(block.init, jax.random.key(0), jnp.asarray(x), jnp.asarray(valid))
        params = jax.tree.map(jnp.asarray, _random_like(shapes["params"], rng))
        params["ln1"]["scale"] = params["ln1"]["scale"] + 1.0  # LayerNorm gains near 1
        params["ln2"]["scale"] = params["ln2"]["scale"] + 1.0

        def loss_fn(p):
            out = block.apply({"params": p}, jnp.asarray(x), jnp.asarray(valid))
            return jnp.sum(out * readout) / b, out

        (loss, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        tx = make_dense_tx(OPTIMIZERS[opt][0])
        updates, _ = tx.update(grads, tx.init(params), params)
        new = jax.tree.map(np.asarray, jax.tree.map(lambda p, u: p + u, params, updates))
        params = jax.tree.map(np.asarray, params)

    layer = torch.nn.TransformerEncoderLayer(
        d, heads, dim_feedforward=ffn, dropout=0.0, activation=torch.nn.LeakyReLU(LEAKY_SLOPE),
        layer_norm_eps=LN_EPS, batch_first=True, norm_first=False).double()
    att = layer.self_attn
    with torch.no_grad():
        att.in_proj_weight.copy_(torch.tensor(np.concatenate(
            [params["wq"].T, params["wk"].T, params["wv"].T])))
        att.out_proj.weight.copy_(torch.tensor(params["wo"].T))
        att.in_proj_bias.zero_()
        att.out_proj.bias.zero_()
        for lin, name in ((layer.linear1, "ffn_0"), (layer.linear2, "ffn_1")):
            lin.weight.copy_(torch.tensor(params[name]["kernel"].T))
            lin.bias.copy_(torch.tensor(params[name]["bias"]))
        for norm, name in ((layer.norm1, "ln1"), (layer.norm2, "ln2")):
            norm.weight.copy_(torch.tensor(params[name]["scale"]))
            norm.bias.copy_(torch.tensor(params[name]["bias"]))
    att.in_proj_bias.requires_grad_(False)
    att.out_proj.bias.requires_grad_(False)
    got_out = layer(torch.tensor(x), src_key_padding_mask=torch.tensor(~valid))
    got_loss = (got_out * torch.tensor(readout)).sum() / b
    got_loss.backward()
    name, kw, _ = OPTIMIZERS[opt][2]
    getattr(torch.optim, name)([q for q in layer.parameters() if q.requires_grad], **kw).step()
    np.testing.assert_allclose(_np(got_out), np.asarray(out), rtol=RTOL, atol=ATOL)
    assert got_loss.item() == pytest.approx(float(loss), rel=RTOL, abs=ATOL)
    w = _np(att.in_proj_weight)
    got = {"wq": w[:d].T, "wk": w[d:2 * d].T, "wv": w[2 * d:].T, "wo": _np(att.out_proj.weight).T,
           "ffn_0": {"kernel": _np(layer.linear1.weight).T, "bias": _np(layer.linear1.bias)},
           "ffn_1": {"kernel": _np(layer.linear2.weight).T, "bias": _np(layer.linear2.bias)},
           "ln1": {"scale": _np(layer.norm1.weight), "bias": _np(layer.norm1.bias)},
           "ln2": {"scale": _np(layer.norm2.weight), "bias": _np(layer.norm2.bias)}}
    diff = 0.0
    for path, want in jax.tree_util.tree_leaves_with_path(new):
        g = got
        for k in path:
            g = g[k.key]
        np.testing.assert_allclose(g, want, rtol=RTOL, atol=ATOL, err_msg=jax.tree_util.keystr(path))
        diff = max(diff, np.abs(g - want).max())
    print({"out": f"{np.abs(_np(got_out) - np.asarray(out)).max():.1e}", "params": f"{diff:.1e}"})
