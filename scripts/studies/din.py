"""DIN (Zhou et al., KDD 2018): target attention against sum pooling on the synthetic teacher
with a behaviour sequence (recjax/data/synthetic_seq.py), the Bayes-optimal NE beside them.

    python scripts/compare.py din [--quick | --smoke] [--seeds 0,1,2] [--out DIR]

Both arms are the same DIN (D = 8, activation unit 36 PReLU, tower 64-32) and differ in
``model.din_pooling`` only: ``attention`` (Eq. 3, weights a(e_j, v_A)) or ``sum`` (every weight 1,
the paper's BaseModel, Sec. 4.2). Whole runs from scratch, paired per seed (init and data order);
one training stream (400k rows, 3 epochs at full size) and one eval stream (50k fresh rows of the
same teacher). The teacher's logit adds alpha = 1 per behaviour of the target's category, which
sum pooling over embeddings of 8 < 40 categories cannot count for every target; the claim is the
paper's direction (Table 3: DIN above the BaseModel), scored on eval NE (lower is better).
"""

from recjax.data.synthetic_seq import describe
from recjax.study import Arm, Claim, Size, Study

TRAIN, EVAL = "synthetic-seq:alpha=1.0,n=", "synthetic-seq:alpha=1.0,split=eval,n="

STUDY = Study(
    name="din",
    title="DIN study: target attention vs sum pooling on a teacher with a behaviour sequence",
    config="default",
    overrides={"model.name": "din", "model.embed_dim": 8, "model.deep_mlp": "64,32",
               "model.att_mlp": "36", "train.batch_size": 256, "train.epochs": 3,
               "dense.lr": 0.003, "sparse.name": "adagrad", "sparse.lr": 0.1,
               "embed.init": "0.1", "train.deterministic": True, "train.eval_batch_size": 8192,
               "train.log_every": 10_000, "train.keep_ckpts": 1},
    datasets={"synthetic-seq": {}},
    arms=(Arm("attention", {"model.din_pooling": "attention"}, "DIN, attention (Eq. 3)"),
          Arm("sum", {"model.din_pooling": "sum"}, "sum pooling (BaseModel)")),
    reference="sum",
    sizes={  # whole runs from scratch: one chunk of the config's length (train.epochs)
        "smoke": Size(base=0, chunk=0, chunks=1, seeds=(0,),
                      overrides={"data.train": TRAIN + "4096", "data.eval": EVAL + "2048",
                                 "train.epochs": 1}),
        "quick": Size(base=0, chunk=0, chunks=1, seeds=(0, 1, 2),
                      overrides={"data.train": TRAIN + "100000", "data.eval": EVAL + "20000"}),
        "full": Size(base=0, chunk=0, chunks=1, seeds=(0, 1, 2, 3, 4),
                     overrides={"data.train": TRAIN + "400000", "data.eval": EVAL + "50000"}),
    },
    claims=(Claim("attention below sum pooling in eval NE", "attention", "sum", "less", None,
                  "Table 3 (DIN above the BaseModel in AUC), Sec. 4.3"),),
    metric="eval_ne",
    metrics=("eval_auc",),
    describe=describe,
    overview=True,
    notes="Adam 3e-3 dense, Adagrad 0.1 sparse, embeddings N(0, 0.1^2), batch 256. The "
          "Bayes-optimal NE is the teacher's sigmoid(z) on the eval rows (bayes_eval_ne).",
)
