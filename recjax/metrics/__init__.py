"""Host-side metrics of click predictions: AUC, log loss, NE, calibration, and their streaming form.

All take numpy arrays (device arrays are copied to the host) and compute in float64.
"""

from recjax.metrics.auc import BucketedAUC, auc
from recjax.metrics.logloss import (
    binary_entropy,
    calibration,
    logloss,
    logloss_from_logits,
    normalized_entropy,
    normalized_entropy_from_logits,
)
from recjax.metrics.streaming import RunningMetrics

__all__ = [
    "BucketedAUC",
    "RunningMetrics",
    "auc",
    "binary_entropy",
    "calibration",
    "logloss",
    "logloss_from_logits",
    "normalized_entropy",
    "normalized_entropy_from_logits",
]
