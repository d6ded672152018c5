"""recjax: CTR models and the distributed algorithms of ShadowSync, GBA, DES and Persia, in JAX.

As a library (README "recjax as a library"; examples/train_on_arrays.py)::

    import recjax
    result = recjax.fit("default", train=recjax.ArraySource(label=y, dense=x, ids=c))

The entry is ``fit``, not ``train``: ``recjax.train`` is the trainer package (recjax/train/),
which any ``import recjax.train.loop`` binds as that attribute. The names below are loaded on
first use (PEP 562), so ``import recjax.cli`` and friends stay as light as before and nothing
imports jax until it is needed.
"""

_LAZY = {"fit": "recjax.api", "make_config": "recjax.api", "ArraySource": "recjax.data.arrays",
         "Config": "recjax.config", "configs": "recjax.configs"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'recjax' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(_LAZY[name])
    return module if name == "configs" else getattr(module, name)
