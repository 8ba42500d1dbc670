"""The engine's C++ CPU kernels (csrc/): built on first use, loaded as torch ops.

`ops()` returns `torch.ops.opencomposer`: the kernels of csrc/kernels.h (rms_norm, linear,
swiglu, moe, attention, argmax_logprob) and csrc/ops.cpp's whole passes built from them
(forward: the main model on T tokens per row; mtp: one MTP depth), or None when the kernels cannot be built here; the engine then
runs its oneDNN/PyTorch path (fused.py, kernels.py) and says so once in the log. Why C++: at
decode shapes (1-16 rows per weight matrix, 2-6 rows per expert) oneDNN and MKL reach 10-30
GFLOP/s on one core, and each of the ~30 PyTorch ops per layer costs microseconds; these kernels
keep a 6x16 tile's accumulators in registers while the packed weight streams through once, and
do the expert grouping, routing, normalisation, RoPE and attention without leaving C++.

Build: g++ (or $CXX) with -O3 -march=native against this torch's headers, no ninja or
setuptools step, into $OPENCOMPOSER_CACHE (default ~/.cache/opencomposer)/kernels/<key>/, where
the key hashes the source, the compiler command, the torch version and this CPU's flags (the
library is tuned to the machine that built it). About 20 s, once per machine; a file lock keeps
concurrent processes from building twice. scripts/setup.sh builds it at setup
(`python -m opencomposer.engine.native`). OPENCOMPOSER_NATIVE=0 disables the kernels.

Packing (`pack_linear`, `pack_swiglu`): weights in panels of 16 output features,
`packed[p, i, j] = W[16p + j, i]`; SwiGLU's gate and up interleaved 8 and 8 per panel.
Left out: dtypes other than float32 and devices other than the CPU (those run the PyTorch path).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCE = CSRC / "ops.cpp"  # includes kernels.h: one translation unit
PANEL = 16
_state: dict = {}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def _command(out: Path) -> list[str]:
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX", "g++")
    lib = Path(torch.__file__).parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return ([cxx, "-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-std=c++20", "-shared",
             "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
            + [f"-I{p}" for p in cpp_extension.include_paths()]
            + [str(SOURCE), f"-L{lib}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}", "-o", str(out)])


def build() -> Path:
    """Compile the kernels (or find the cached build); returns the shared library's path.
    Raises RuntimeError with the compiler's message when it fails."""
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler ({cxx!r} not found): install one (Debian: apt-get install g++)")
    probe = _command(Path("OUT"))
    sources = [p.read_text() for p in sorted(CSRC.iterdir()) if p.suffix in (".cpp", ".h")]
    key = hashlib.sha256("\0".join(sources + [" ".join(probe), torch.__version__, _cpu_flags(),
                                              sys.platform]).encode()).hexdigest()[:16]
    root = Path(os.environ.get("OPENCOMPOSER_CACHE", Path.home() / ".cache" / "opencomposer"))
    folder = root / "kernels" / key
    lib = folder / "opencomposer_kernels.so"
    if lib.is_file():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.is_file():  # another process built it while we waited
            return lib
        tmp = folder / f"build-{os.getpid()}.so"
        log.info("building the engine's C++ kernels (once per machine, ~20 s): %s", folder)
        run = subprocess.run(_command(tmp), capture_output=True, text=True)
        if run.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"compiling {SOURCE} failed:\n{run.stderr[-3000:]}")
        os.replace(tmp, lib)
    return lib


def ops():
    """torch.ops.opencomposer once the kernels are built and loaded, else None (the reason is
    logged once, and kept in `unavailable_reason()`)."""
    if "ops" not in _state:
        _state["ops"], _state["reason"] = None, None
        if os.environ.get("OPENCOMPOSER_NATIVE", "1") == "0":
            _state["reason"] = "disabled by OPENCOMPOSER_NATIVE=0"
        else:
            try:
                if not hasattr(torch.ops.opencomposer, "moe"):
                    torch.ops.load_library(str(build()))
                _state["ops"] = torch.ops.opencomposer
            except (RuntimeError, OSError) as e:
                _state["reason"] = str(e)
                log.warning("opencomposer: the engine's C++ kernels are unavailable, so the engine runs its "
                            "slower PyTorch/oneDNN path. Reason: %s", e)
    return _state["ops"]


def unavailable_reason() -> str | None:
    ops()
    return _state["reason"]


def pack_linear(w_OI: torch.Tensor) -> torch.Tensor:
    """[..., O, I] -> [..., ceil(O/16), I, 16], zero-padded: panel p holds output features
    16p..16p+15 (leading dims, e.g. experts, are kept)."""
    *lead, O, I = w_OI.shape
    nP = -(-O // PANEL)
    padded_OI = torch.zeros(*lead, nP * PANEL, I, dtype=w_OI.dtype)
    padded_OI[..., :O, :] = w_OI
    return padded_OI.view(*lead, nP, PANEL, I).transpose(-1, -2).contiguous()


def pack_swiglu(gate_FI: torch.Tensor, up_FI: torch.Tensor) -> torch.Tensor:
    """gate, up [..., F, I] -> [..., ceil(F/8), I, 16]: lanes 0-7 of panel p are gate features
    8p..8p+7, lanes 8-15 the same up features (zero-padded)."""
    *lead, F_, I = gate_FI.shape
    nP = -(-F_ // 8)
    halves = []
    for w_FI in (gate_FI, up_FI):
        padded = torch.zeros(*lead, nP * 8, I, dtype=w_FI.dtype)
        padded[..., :F_, :] = w_FI
        halves.append(padded.view(*lead, nP, 8, I))
    both = torch.cat(halves, dim=-2)                      # [..., nP, 16, I]
    return both.transpose(-1, -2).contiguous()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print("engine C++ kernels:", "ready" if ops() is not None else f"unavailable ({unavailable_reason()})")
