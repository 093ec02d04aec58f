"""twell: sparse FFNs for ReLU transformer LMs (TwELL inference, hybrid-format training).

`twell._twell` holds the compiled ops (the CPU functions, and in a CUDA build the per-layer CUDA
classes); `twell.torch` registers them as PyTorch custom ops with autograd and fake-tensor support.
"""
try:
    # PyTorch first, when it is there: a CUDA build of _twell links the CUDA toolkit's libcublasLt,
    # and PyTorch ships its own under the same soname. Whichever loads first serves both; PyTorch's
    # works for twell's calls, twell's (another release) does not for PyTorch's, which then crashes
    # the process (seen: `python -m twell.train` aborting in free() on the GPU machine).
    import torch  # noqa: F401
except ImportError:
    pass
from . import _twell  # noqa: E402,F401

__all__ = ["_twell"]
__version__ = "0.1.0"
