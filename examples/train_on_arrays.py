"""Train DeepFM on one's own numpy arrays: `python examples/train_on_arrays.py` (~30 s on 2 cores)."""
import numpy as np

import recjax

rng = np.random.default_rng(0)
n, vocab = 20_000, [100, 50, 20]
dense = rng.normal(size=(n, 4)).astype(np.float32)  # numerical features, already scaled
ids = np.stack([rng.integers(0, v, n) for v in vocab], axis=1)  # one categorical id per field
# labels from a teacher: one dense column, and the parity of field 0's id
logit = 1.5 * dense[:, 0] + np.where(ids[:, 0] % 2 == 0, 1.0, -1.0) - 0.5
label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
train = recjax.ArraySource(label[:16_000], dense[:16_000], ids[:16_000], vocab_sizes=vocab)
valid = recjax.ArraySource(label[16_000:], dense[16_000:], ids[16_000:], vocab_sizes=vocab)
result = recjax.fit("default", train=train, eval=valid, overrides={
    "model.name": "deepfm", "train.batch_size": 256, "train.epochs": 3, "train.progress": False})
print(f"valid AUC {result['eval_auc']:.4f}  NE {result['eval_ne']:.4f}")
