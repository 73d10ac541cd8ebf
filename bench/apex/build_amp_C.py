"""Build apex 25.04's `amp_C` CUDA extension (what apex.optimizers.FusedAdam and apex.amp's
fused scaling need) from a checkout of its source, without apex's setup.py.

apex's own `--cuda_ext` build compiles some twenty extensions one file at a time; FusedAdam
needs only amp_C. This compiles amp_C's sources in parallel (one nvcc per file) with the
flags torch's CUDAExtension uses, links them, and leaves amp_C*.so in --out. Put --out on
PYTHONPATH (torchrun's children inherit it).

Usage (GPU machine, CUDA torch, nvcc):  python3 bench/apex/build_amp_C.py --src .apex --out /tmp/apex_ext
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# amp_C's sources as apex 25.04's setup.py lists them (paths inside the apex checkout).
SOURCES = ["csrc/amp_C_frontend.cpp"] + [
    f"csrc/{n}.cu"
    for n in (
        "multi_tensor_sgd_kernel multi_tensor_scale_kernel multi_tensor_axpby_kernel "
        "multi_tensor_l2norm_kernel multi_tensor_l2norm_kernel_mp multi_tensor_l2norm_scale_kernel "
        "multi_tensor_lamb_stage_1 multi_tensor_lamb_stage_2 multi_tensor_adam multi_tensor_adagrad "
        "multi_tensor_novograd multi_tensor_lamb multi_tensor_lamb_mp update_scale_hysteresis"
    ).split()
]


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--src", default=".apex", help="apex 25.04 checkout")
    p.add_argument("--out", default="/tmp/apex_ext")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    p.add_argument(
        "--arch", default=None, help="TORCH_CUDA_ARCH_LIST (default: the GPUs present)"
    )
    a = p.parse_args()

    import torch
    import torch.utils.cpp_extension as ext

    if a.arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = a.arch
    elif torch.cuda.is_available():
        cc = sorted(
            {
                torch.cuda.get_device_capability(i)
                for i in range(torch.cuda.device_count())
            }
        )
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(f"{x}.{y}" for x, y in cc)
    cuda_home = ext.CUDA_HOME
    if cuda_home is None:
        print("no CUDA toolkit found (CUDA_HOME); amp_C needs nvcc", file=sys.stderr)
        return 2
    nvcc = str(Path(cuda_home) / "bin" / "nvcc")
    src, out = Path(a.src).resolve(), Path(a.out).resolve()
    objdir = out / "obj"
    objdir.mkdir(parents=True, exist_ok=True)

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    incs = [f"-I{d}" for d in ext.include_paths(device_type="cuda")] + [
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{src / 'csrc'}",
    ]
    # apex's setup.py adds these for torch >= 1.5.
    macros = ["-DVERSION_GE_1_1", "-DVERSION_GE_1_3", "-DVERSION_GE_1_5"]
    defs = [
        "-DTORCH_EXTENSION_NAME=amp_C",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
    ]
    arch = ext._get_cuda_arch_flags()
    cxx_flags = ["-O3", "-fPIC", "-std=c++20"] + macros + defs + incs
    nvcc_flags = (
        [
            "-O3",
            "-lineinfo",
            "--use_fast_math",
            "-std=c++20",
            "--compiler-options",
            "-fPIC",
        ]
        + ext.COMMON_NVCC_FLAGS
        + arch
        + macros
        + defs
        + incs
    )

    def compile_one(rel: str):
        s = src / rel
        o = objdir / (s.name + ".o")
        cmd = (["c++"] + cxx_flags if s.suffix == ".cpp" else [nvcc] + nvcc_flags) + [
            "-c",
            str(s),
            "-o",
            str(o),
        ]
        t = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        return rel, o, r, time.time() - t, cmd

    t0 = time.time()
    print(
        f"torch {torch.__version__} cuda {torch.version.cuda} nvcc {nvcc} arch {arch} jobs {a.jobs}",
        flush=True,
    )
    objs, failed = [], False
    with ThreadPoolExecutor(a.jobs) as pool:
        for rel, o, r, dt, cmd in pool.map(compile_one, SOURCES):
            print(
                f"  {'ok ' if r.returncode == 0 else 'ERR'} {rel} ({dt:.0f} s)",
                flush=True,
            )
            if r.returncode:
                failed = True
                print(
                    "    $ " + shlex.join(cmd) + "\n" + (r.stdout + r.stderr)[-4000:],
                    flush=True,
                )
            objs.append(str(o))
    if failed:
        return 1
    libs = [f"-L{d}" for d in ext.library_paths(device_type="cuda")]
    so = out / ("amp_C" + sysconfig.get_config_var("EXT_SUFFIX"))
    link = (
        ["c++", "-shared"]
        + objs
        + libs
        + [
            "-lc10",
            "-lc10_cuda",
            "-ltorch",
            "-ltorch_cpu",
            "-ltorch_cuda",
            "-ltorch_python",
            "-lcudart",
            "-o",
            str(so),
        ]
    )
    r = subprocess.run(link, capture_output=True, text=True)
    if r.returncode:
        print(
            "link failed:\n$ " + shlex.join(link) + "\n" + r.stdout + r.stderr,
            flush=True,
        )
        return 1
    print(f"built {so} in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
