"""RoPE's config.json keys in the layout the installed transformers writes.

transformers >= 5 keeps RoPE in "rope_parameters" ({"rope_type", "rope_theta", ...}); 4.x reads a
top-level "rope_theta" and "rope_scaling" and does not know "rope_parameters" (it would run θ = 1e4
without a word). Without transformers installed both layouts are written, with equal values: each
version reads its own, and twell's reader accepts both when they agree.
"""


def transformers_major():
    try:
        import transformers
    except ImportError:
        return None
    return int(transformers.__version__.split(".")[0])


def rope_keys(theta, scaling=None):
    """config.json entries for RoPE with base `theta` and an optional scaling dict
    ({"rope_type": "linear", "factor": 2.0, ...}; None: plain RoPE)."""
    params = {"rope_type": "default", **(scaling or {}), "rope_theta": float(theta)}
    legacy = {"rope_theta": float(theta), "rope_scaling": dict(scaling) if scaling else None}
    major = transformers_major()
    if major is not None and major < 5:
        return legacy
    if major is not None:
        return {"rope_parameters": params}
    return {"rope_parameters": params, **legacy}
