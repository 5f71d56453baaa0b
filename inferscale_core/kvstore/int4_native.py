"""The CPU's int4 expansion in one pass: ``int4_expand.c``, built on first use.

torch expands a 4-bit entry in three passes over its float32 output (nibble, multiply-add, the
wide channels' low bits), each as long as the copy a plain entry needs; the C kernel writes
each output element once, from the codes, so a compressed entry reaches the cache at about a
plain copy's cost. Measured on one thread (2-core AMD EPYC, AVX2), 50 SmolLM2-shaped entries of
55 tokens: torch 49-55 ms, this kernel 14.9 ms, copying fp32 entries 15.7 ms.

The kernel is built with the machine's C compiler (``$CC``, else ``cc``; ``-O3 -march=native
-ffp-contract=off``, without ``-march=native`` where the compiler refuses it) into
:func:`~inferscale_core.paths.cache_dir`/kernels, named by a hash of the source, the compiler
and this CPU's flags, and loaded with ctypes (which lets go of the GIL for the call, so the
load's threads expand side by side). Without a compiler, or when the build fails,
:func:`kernel` is None and :func:`status` says why: the torch path then does the same work, bit
for bit, slower. ``INFERSCALE_INT4_KERNEL=torch`` chooses the torch path (benches).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from inferscale_core.types import FactKV

ENV = "INFERSCALE_INT4_KERNEL"
_SOURCE = Path(__file__).with_name("int4_expand.c")
_FLAGS = ("-O3", "-ffp-contract=off", "-shared", "-fPIC", "-std=c99")
_NATIVE = "-march=native"  # this CPU's vector units; a compiler that refuses it builds without
_BUILD_TIMEOUT_S = 120

_lock = threading.Lock()
_kernel: ctypes.CDLL | None = None
_status: str | None = None  # None: not tried yet


def kernel() -> ctypes.CDLL | None:
    """The built kernel, or None (:func:`status` says why); built once a process."""
    global _kernel, _status
    with _lock:
        if _status is None:
            try:
                _kernel, _status = _load(_build()), "C kernel"
            except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                _kernel, _status = None, f"torch ({error})"
        return _kernel


def status() -> str:
    """How this process expands int4 entries on the CPU: "C kernel", or "torch (why)"."""
    if os.environ.get(ENV) == "torch":
        return f"torch ({ENV}=torch)"
    kernel()
    assert _status is not None
    return _status


def expand_into(
    entry: FactKV, start: int, end: int, k_out: torch.Tensor, v_out: torch.Tensor
) -> bool:
    """Tokens ``[start, end)`` of an int4 ``entry`` expanded into ``k_out`` and ``v_out``
    (float32 ``[layers, end - start, heads, dim]`` views on the CPU, channels contiguous) by the
    kernel; False where it does not apply (then the caller's torch path writes all of it)."""
    quant = entry.quant
    if (
        quant is None
        or quant.scheme != "int4"
        or os.environ.get(ENV) == "torch"
        or not _writable(k_out, (entry.k.shape[0], end - start, entry.k.shape[2], quant.k_dim))
        or not _writable(v_out, (entry.v.shape[0], end - start, entry.v.shape[2], quant.v_dim))
    ):
        return False
    lib = kernel()
    if lib is None:
        return False
    assert quant.k_zero is not None and quant.v_zero is not None
    layers, tokens, heads, _ = entry.k.shape
    k_dim, v_dim = quant.k_dim, quant.v_dim
    codes_k, codes_v = entry.k.contiguous(), entry.v.contiguous()  # the store's are: no copy
    k_scale, k_zero = _f32(quant.k_scale), _f32(quant.k_zero)  # [L, 1, H, D]
    v_scale, v_zero = _f32(quant.v_scale), _f32(quant.v_zero)  # [L, T, H, G]
    wide = 0 if quant.k_fine is None else 2 * quant.k_fine.shape[-1]
    fine = quant.k_fine.contiguous() if quant.k_fine is not None else None
    slot = quant.k_slot.contiguous() if quant.k_slot is not None else None
    done = lib.int4_keys(
        codes_k.data_ptr(), k_scale.data_ptr(), k_zero.data_ptr(),
        fine.data_ptr() if fine is not None else None,
        slot.data_ptr() if slot is not None else None,
        layers, tokens, heads, k_dim, wide, start, end, k_out.data_ptr(), *k_out.stride()[:3],
    )  # fmt: skip
    if done != 0:
        return False
    done = lib.int4_values(
        codes_v.data_ptr(), v_scale.data_ptr(), v_zero.data_ptr(),
        layers, tokens, heads, v_dim, v_scale.shape[-1], start, end,
        v_out.data_ptr(), *v_out.stride()[:3],
    )  # fmt: skip
    return done == 0


# ---- helpers ----
def _writable(out: torch.Tensor, shape: tuple[int, int, int, int]) -> bool:
    return (
        out.device.type == "cpu"
        and out.dtype == torch.float32
        and tuple(out.shape) == shape
        and out.stride(-1) == 1
    )


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).contiguous()


def _build() -> Path:
    """The shared library for this source, compiler and CPU: built once, then reused."""
    from inferscale_core.paths import cache_dir

    name = os.environ.get("CC") or "cc"
    compiler = shutil.which(name)
    if compiler is None:
        raise RuntimeError(f"no C compiler ({name}) on PATH")
    source = _SOURCE.read_bytes()
    made_by = " ".join((compiler, _NATIVE, *_FLAGS, _cpu_flags())).encode()
    tag = hashlib.sha256(source + made_by).hexdigest()[:16]
    folder = cache_dir() / "kernels"
    folder.mkdir(mode=0o700, exist_ok=True)
    target = folder / f"int4_expand-{tag}.so"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        built = Path(scratch) / target.name
        for flags in ((_NATIVE, *_FLAGS), _FLAGS):
            done = subprocess.run(
                [compiler, *flags, "-o", str(built), str(_SOURCE)],
                capture_output=True,
                text=True,
                timeout=_BUILD_TIMEOUT_S,
            )
            if done.returncode == 0:
                break
        else:
            first = (done.stderr.strip().splitlines() or ["no output"])[0]
            raise RuntimeError(f"{Path(compiler).name} failed: {first}")
        built.chmod(0o600)
        os.replace(built, target)  # another process may build the same file: either wins
    return target


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.int4_keys.argtypes = [ptr] * 5 + [i64] * 7 + [ptr] + [i64] * 3
    lib.int4_values.argtypes = [ptr] * 3 + [i64] * 7 + [ptr] + [i64] * 3
    lib.int4_keys.restype = lib.int4_values.restype = ctypes.c_int
    return lib


def _cpu_flags() -> str:
    """This CPU's feature flags (``-march=native`` builds for them): a home folder shared by
    two machines keeps one build each."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return torch.backends.cpu.get_cpu_capability()
