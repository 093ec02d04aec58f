"""twell: sparse FFNs for ReLU transformer LMs (TwELL inference, hybrid-format training).

`twell._twell` holds the compiled CPU ops (float32, DLPack arrays in, caller-allocated arrays out);
`twell.torch` registers them as PyTorch custom ops with autograd and fake-tensor support.
"""
from . import _twell  # noqa: F401

__all__ = ["_twell"]
__version__ = "0.1.0"
