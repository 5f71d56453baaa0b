"""The inverse of :func:`inferscale_core.rope.rotate`, for the tests' oracles (the product only
moves stored keys forward, with ``rope.shift``)."""

from __future__ import annotations

import torch

from inferscale_core.rope import RopeSpec, pure_rotation, rotate


def unrotate(
    k_post: torch.Tensor,  # [..., tokens, kv_heads, head_dim]
    positions: torch.Tensor,  # [tokens] int64 positions ``k_post`` was rotated to
    spec: RopeSpec,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Keys before ``rotate``: the rotation by ``-angle``, its rotary dims divided by
    ``attention_scaling`` (yarn's mscale); fp32 math, one rounding to ``out_dtype`` (default:
    the input's)."""
    back = rotate(k_post, -positions, pure_rotation(spec), out_dtype=torch.float32)
    back[..., : spec.rotary_dim] /= spec.attention_scaling  # the pass-through dims: unscaled
    return back.to(out_dtype or k_post.dtype)
