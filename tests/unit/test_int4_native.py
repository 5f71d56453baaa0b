"""The CPU's C kernel for int4 entries (inferscale_core/kvstore/int4_native.py): built with the
machine's compiler, it writes the bits torch's path writes, into any slice of a scratch; a
machine without a compiler, or whose compiler fails, gets the torch path and is told why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from inferscale_core.kvstore import int4_native
from inferscale_core.kvstore.quant import dequantize_into, quantize
from inferscale_core.types import FactKV

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC") or "cc") is None,
    reason="no C compiler here: the kernel is not built (its absence is tested below)",
)


def _int4(layers: int, tokens: int, heads: int, k_dim: int, v_dim: int, seed: int) -> FactKV:
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(layers, tokens, heads, k_dim, generator=gen)
    k[..., 1] *= 40  # an outlier channel: a wide one where the head has them
    v = torch.randn(layers, tokens, heads, v_dim, generator=gen) * 3
    return quantize(FactKV(f"f{seed}", list(range(tokens)), k, v, "fp", origin=0), "int4")


def _torch_path(entry, start, end, k_out, v_out, monkeypatch) -> None:
    with monkeypatch.context() as m:
        m.setenv(int4_native.ENV, "torch")
        dequantize_into(entry, start, end, k_out, v_out)


@pytest.mark.parametrize(
    ("k_dim", "v_dim", "heads"),
    [(64, 64, 3), (128, 128, 2), (32, 32, 4), (8, 8, 1)],
    ids=["smollm2-head", "two-value-groups", "narrow", "no-wide-channels"],
)
def test_the_kernel_writes_the_torch_paths_bits(k_dim, v_dim, heads, monkeypatch):
    assert int4_native.status() == "C kernel"
    entry = _int4(layers=3, tokens=11, heads=heads, k_dim=k_dim, v_dim=v_dim, seed=k_dim + heads)
    q = entry.quant
    assert q is not None and (q.k_fine is None) == (k_dim < 16)
    assert q.v_scale.shape[-1] == max(1, v_dim // 64)
    # tokens 2..9 into rows 5..12 of a scratch as the connector's: the rest is left as it was
    scratch = [torch.full((3, 20, heads, dim), 7.0) for dim in (k_dim, v_dim)]
    expected = [t.clone() for t in scratch]
    _torch_path(entry, 2, 9, expected[0][:, 5:12], expected[1][:, 5:12], monkeypatch)
    assert int4_native.expand_into(entry, 2, 9, scratch[0][:, 5:12], scratch[1][:, 5:12])
    assert torch.equal(scratch[0], expected[0]) and torch.equal(scratch[1], expected[1])
    assert not torch.equal(scratch[0][:, 5:12], torch.full_like(scratch[0][:, 5:12], 7.0))


def test_what_the_kernel_does_not_take_is_left_to_torch(monkeypatch):
    entry = _int4(layers=2, tokens=6, heads=2, k_dim=64, v_dim=64, seed=1)
    k16, v16 = torch.zeros(2, 6, 2, 64, dtype=torch.bfloat16), torch.zeros(2, 6, 2, 64)
    assert not int4_native.expand_into(entry, 0, 6, k16, v16)  # not float32
    wrong = torch.zeros(2, 5, 2, 64)
    assert not int4_native.expand_into(entry, 0, 6, wrong, torch.zeros(2, 6, 2, 64))
    strided = torch.zeros(2, 6, 2, 128)[..., ::2]  # channels not contiguous
    assert not int4_native.expand_into(entry, 0, 6, strided, torch.zeros(2, 6, 2, 64))
    plain = FactKV("p", list(range(6)), torch.ones(2, 6, 2, 64), torch.ones(2, 6, 2, 64), "fp")
    assert not int4_native.expand_into(plain, 0, 6, torch.zeros(2, 6, 2, 64), v16)
    monkeypatch.setenv(int4_native.ENV, "torch")
    assert not int4_native.expand_into(entry, 0, 6, torch.zeros(2, 6, 2, 64), v16)
    assert int4_native.status() == f"torch ({int4_native.ENV}=torch)"


_CHILD = textwrap.dedent(
    """
    import json, torch
    from inferscale_core.kvstore import int4_native
    from inferscale_core.kvstore.quant import dequantize_into, quantize
    from inferscale_core.types import FactKV
    gen = torch.Generator().manual_seed(5)
    k, v = torch.randn(2, 7, 2, 64, generator=gen), torch.randn(2, 7, 2, 64, generator=gen)
    entry = quantize(FactKV("f", list(range(7)), k, v, "fp", origin=0), "int4")
    k_out, v_out = torch.zeros(2, 7, 2, 64), torch.zeros(2, 7, 2, 64)
    dequantize_into(entry, 0, 7, k_out, v_out)
    print(json.dumps({"status": int4_native.status(), "k": k_out.sum().item(),
                      "v": v_out.sum().item()}))
    """
)


def _child(tmp_path, **env) -> dict:
    environ = {**os.environ, "INFERSCALE_CACHE": str(tmp_path / "cache"), **env}
    environ.pop(int4_native.ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], env=environ, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_a_working_compiler_torch_expands_and_says_why(tmp_path):
    built = _child(tmp_path)
    assert built["status"] == "C kernel"
    kernels = list((tmp_path / "cache" / "kernels").iterdir())
    assert [p.suffix for p in kernels] == [".so"]  # one build, no scratch left
    assert oct(kernels[0].stat().st_mode & 0o777) == "0o600"
    assert oct(kernels[0].parent.stat().st_mode & 0o777) == "0o700"
    made = kernels[0].stat().st_mtime_ns
    assert _child(tmp_path) == built  # the build on disk is loaded, not made again
    assert list(kernels[0].parent.iterdir()) == kernels and kernels[0].stat().st_mtime_ns == made
    missing = _child(tmp_path / "other", CC="/nonexistent/cc")
    assert missing["status"] == "torch (no C compiler (/nonexistent/cc) on PATH)"
    failing = tmp_path / "failing-cc"
    failing.write_text("#!/bin/sh\necho 'cc1: error: no such target' >&2\nexit 1\n")
    failing.chmod(0o700)
    broken = _child(tmp_path / "third", CC=str(failing))
    assert broken["status"] == "torch (failing-cc failed: cc1: error: no such target)"
    for other in (missing, broken):  # the same entry, the same numbers, by torch
        assert (other["k"], other["v"]) == (built["k"], built["v"])
    picky = tmp_path / "picky-cc"  # a compiler without -march=native (some clang targets)
    real = shutil.which(os.environ.get("CC") or "cc")
    picky.write_text(
        f'#!/bin/sh\ncase " $* " in *" -march=native "*) echo "no native" >&2; exit 1;; esac\n'
        f'exec {real} "$@"\n'
    )
    picky.chmod(0o700)
    portable = _child(tmp_path / "fourth", CC=str(picky))
    assert portable == built  # built without it: the kernel, the same numbers
