"""A Parquet dataset read from several threads at once (the host-async workers share one
source): every row group decodes as it does alone. Without ParquetSource's lock pyarrow's
ParquetFile, shared across threads, crashed the process (segmentation fault) or raised
"ReadRangeCache did not find matching cache entry" (the slow test that trains `fr` from
parquet:DIR, once under load); the reads run in a subprocess so a crash fails the test only.
"""

import subprocess
import sys

from recjax.data.convert import convert
from tests.conftest import ROOT, data_path

READ = """
import sys, threading
import numpy as np
from recjax.data.sources import open_source
src = open_source("parquet:" + sys.argv[1])
want = [src.read_group(g).ids.copy() for g in src.groups]
errors = []
def work(k):
    try:
        for _ in range(10):
            for i in range(len(src.groups)):
                g = (i * 7 + k) % len(src.groups)
                if not np.array_equal(src.read_group(src.groups[g]).ids, want[g]):
                    errors.append(g)
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
[t.start() for t in threads]
[t.join() for t in threads]
print("errors", len(errors), errors[:2])
"""


def test_threads_share_one_source(tmp_path):
    d = tmp_path / "pq"
    convert([f"criteo:{data_path('criteo_kaggle_8k', 'train.tsv')}"], str(d), rows_per_group=300)
    r = subprocess.run([sys.executable, "-c", READ, str(d)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "errors 0 []" in r.stdout, r.stdout[-2000:]
