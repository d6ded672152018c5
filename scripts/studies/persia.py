"""Persia (Lian et al., KDD 2022): Table 2, Sec. 6.3, Theorem 1 and Sec. 4.2.2 analogues.

    python scripts/compare.py persia [--quick | --smoke] [--seeds 0,1,2] [--out DIR]
                                     [--datasets synthetic,criteo,avazu,taobao] [--doc docs/persia.md]

Per seed every arm reads the same data order and eval rows, so arms are paired. At full size
on the synthetic task the sync arm trains a shared base (100 of the pass's 400 global steps) and
every arm continues from it for the rest of the pass; at --quick, --smoke and on the samples
every arm trains from scratch for one pass (Taobao: 10). (Table 2) ``--persia.mode`` hybrid,
sync and async: eval AUC on the synthetic teacher task (DLRM; it stands in for the paper's own
Kwai-Video) and on the Criteo, Avazu and Taobao samples (DeepFM: the paper's model is an MLP on
the embeddings).
(Sec. 6.3) the same runs' throughput on the deterministic virtual clock (examples per modelled
second; ``scripts/bench_persia.py`` measures threads). (Theorem 1, Eq. 6) hybrid against the
staleness bound tau, with 8 embedding workers so that a large tau is reached; each dataset's
alpha (the largest fraction of samples sharing one id) is in its table. (Sec. 4.2.2) the Criteo
sample with ``--embed.store lru``: a capacity of half the largest field's 3,920 distinct raw
ids (evicts), and one of twice it (never evicts: what raw ids instead of hashing change).

Full size (issue 35's paper scale) on the synthetic task: 16 NN workers and 8 embedding workers,
global batch 1024 (64 rows a worker), tau = 4 ("less than 5 for most cases", Sec. 5) and the
sweep tau in {0, 4, 16}, one embedding worker 4x slower (``slow:k=1,factor=4``), one pass of
409,600 teacher rows scored on 1,000,000 eval rows, 6 seeds; async's dense staleness is then
real (16 NN workers apply their gradients in turn: mean ~10, max 15). The samples (Criteo,
Avazu 400-500 eval rows, Taobao) run with 2 NN workers and 4 embedding workers and are
reported with their spread, not scored: an AUC SE of ~0.03 cannot speak to effects of 0.001-
0.009. ``--quick`` keeps 2 NN workers, global batch 256. The paper runs 8-64 GPUs on full
datasets.
"""

from recjax.study import Arm, Claim, Size, Study, Sweep
from recjax.study.data import id_alpha

REAL = {"config": "criteo", "data.multi_hot_len": 8, "model.name": "deepfm",
        "model.embed_dim": 8, "model.deep_mlp": "64,32", "train.batch_size": 128}
WITHIN = 0.001  # Table 2 / Sec. 6.2: "the test AUC gap between the hybrid mode and synchronous
#                 mode is always less than 0.1%" (percentage points: 65.86% vs 65.93%, ...)
# Table 2, async (XDL) - sync and async - hybrid, per benchmark; synthetic: the Kwai-Video row
# (the samples' rows are shown in the notes: their runs are reported, not scored)
ASYNC_VS_SYNC = {"synthetic": -0.0047, "criteo": -0.0050, "avazu": -0.0092, "taobao": -0.0027}
ASYNC_VS_HYBRID = {"synthetic": -0.0047, "criteo": -0.0046, "avazu": -0.0083, "taobao": -0.0020}
SCORED = ("synthetic",)  # the datasets whose size can resolve the claims
SMALL = {"persia.nn_workers": 2, "persia.embedding_workers": 4}  # the samples at every size
CAPACITY = 1960  # half the Criteo sample's largest field (3,920 distinct raw ids)
STEPS, BASE = 400, 100  # full size, synthetic: one pass of 400 global steps of 1024, the first
#                         100 a shared sync base
# a rate of the arm's own segment (after a shared base, the summary's examples_per_sec counts
# the base's steps and time too; from scratch the two are the same)
RATE = "segment_examples_per_sec"

STUDY = Study(
    name="persia",
    title="Persia study: Table 2, Sec. 6.3, Theorem 1 and Sec. 4.2.2 analogues",
    config="default",  # DLRM, Adam 2e-3 dense, Adagrad 0.05 sparse
    overrides={"train.algo": "persia", "train.epochs": 1, "train.deterministic": True,
               "train.eval_batch_size": 8192, "train.log_every": 10_000, "train.keep_ckpts": 1,
               "persia.nn_workers": 2, "persia.embedding_workers": 4, "persia.staleness": 4,
               "persia.embedding_stragglers": "slow:k=1,factor=4"},
    datasets={
        "synthetic": {"train.batch_size": 256},
        "criteo": {**REAL, "data.train": "criteo:criteo_kaggle_8k/train.tsv",
                   "data.eval": "criteo:criteo_kaggle_8k/valid.tsv"},
        "avazu": {**REAL, "data.train": "avazu:avazu_9k/train.csv",
                  "data.eval": "avazu:avazu_9k/valid.csv"},
        "taobao": {**REAL, "data.train": "taobao:taobao_ad_tiny/train_sample.csv",
                   "data.eval": "taobao:taobao_ad_tiny/valid_sample.csv",
                   "train.batch_size": 32, "train.epochs": 10},
    },
    arms=(Arm("hybrid", {"persia.mode": "hybrid"}), Arm("sync", {"persia.mode": "sync"}),
          Arm("async", {"persia.mode": "async"}),
          *(Arm(name, {"persia.mode": "hybrid", "embed.store": "lru", "embed.capacity": cap},
                f"hybrid, LRU of {cap} rows", datasets=("criteo",))
            for name, cap in (("lru", CAPACITY), ("lru_roomy", 4 * CAPACITY)))),
    reference="sync",
    sweeps=(Sweep("tau", "persia.staleness",
                  {"smoke": (0, 2), "quick": (0, 1, 4, 16), "full": (0, 4, 16)},
                  {"persia.mode": "hybrid", "persia.embedding_workers": 8},
                  datasets=("synthetic",)),),
    sizes={  # smoke, quick: whole runs from scratch (one chunk of the config's length)
        "smoke": Size(base=0, chunk=0, chunks=1, seeds=(0,),
                      overrides={"config": "smoke", "train.batch_size": 64,
                                 "synthetic.n_train": 24 * 64, "synthetic.n_eval": 2048}),
        "quick": Size(base=0, chunk=0, chunks=1, seeds=(0, 1),
                      overrides={"synthetic.n_train": 300 * 256, "synthetic.n_eval": 20_000}),
        # full, synthetic: per seed, sync (the reference) trains a shared base of BASE global
        # steps, and every arm continues from it for the rest of the pass (the paired design of
        # issue 35: from scratch, the arms' paired AUC spread 0.003-0.009 over seeds and a
        # second seed set flipped a verdict); the samples stay whole runs from scratch
        "full": Size(base=BASE, chunk=STEPS - BASE, chunks=1, seeds=(0, 1, 2, 3, 4, 5),
                     overrides={"persia.nn_workers": 16, "persia.embedding_workers": 8,
                                "synthetic.n_train": STEPS * 1024, "synthetic.n_eval": 1_000_000},
                     datasets={"synthetic": {"train.batch_size": 1024},
                               **{ds: SMALL for ds in ("criteo", "avazu", "taobao")}},
                     schedules={ds: {"base": 0, "chunk": 0}
                                for ds in ("criteo", "avazu", "taobao")}),
    },
    claims=(
        Claim(f"hybrid within {WITHIN} AUC of sync", "hybrid", "sync", "within", WITHIN,
              "Table 2, Sec. 6.2", datasets=SCORED),
        *(Claim("async below sync", "async", "sync", "less", e, "Table 2", datasets=(ds,))
          for ds, e in ASYNC_VS_SYNC.items() if ds in SCORED),
        *(Claim("async below hybrid", "async", "hybrid", "less", e, "Table 2", datasets=(ds,))
          for ds, e in ASYNC_VS_HYBRID.items() if ds in SCORED),
        Claim("hybrid faster than sync (examples/s, virtual clock)", "hybrid", "sync", "greater",
              2.6, "Sec. 6.3, Fig. 9 right; Kwai-Video 3.8x", metric=RATE,
              scale="ratio", datasets=SCORED),
        Claim("async faster than hybrid (examples/s, virtual clock)", "async", "hybrid",
              "greater", 1.2, "Sec. 6.3, Fig. 9 right", metric=RATE, scale="ratio",
              datasets=SCORED),
        Claim("AUC at tau = 16 below tau = 0 (a bound: direction only)", "tau=16", "tau=0",
              "less", None, "Theorem 1, Eq. 6: the alpha tau / T term"),
    ),
    metric="eval_auc",
    metrics=("eval_ne", RATE),
    counters=("embedding_staleness", "dense_staleness", "lru.total.admitted",
              "lru.total.evicted", "lru.total.not_admitted", "lru.total.dropped_gradients"),
    describe=id_alpha,
    overview=True,
    notes="Synthetic: DLRM (`configs.default()`), 16 NN and 8 embedding workers, global batch "
          "1024 at full size, every arm continuing from a shared sync base of 100 of the pass's "
          "400 steps (2 and 4, 256 at --quick, from scratch). Throughput: the arm's own "
          "segment's rate. The samples are reported, not scored "
          "(Table 2's async - sync there: Criteo -0.0050, Avazu -0.0092, Taobao -0.0027; "
          "async - hybrid -0.0046, -0.0083, -0.0020). Samples: DeepFM (D = 8, deep "
          "64-32, Adam 1e-3 / Adagrad 0.01, 2^15 hash buckets), batch 128 (Taobao: 32 for 10 "
          "epochs), evaluated on the sample's own valid file. Throughput is the virtual "
          "clock's (bit-reproducible; NN compute 20 us per example, 0.5 us per looked-up id). "
          "The LRU arms (Sec. 4.2.2) carry no claim: the paper describes the store, not its "
          "effect on AUC. Verdicts speak for 16 NN workers on the teacher task, not the paper's "
          "8-64 GPUs on full datasets (its async is XDL's, another system).",
)
