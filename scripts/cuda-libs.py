#!/usr/bin/env python3
"""Where NVIDIA's Python wheels keep cuDNN, NCCL and NVRTC, for the build to use.

A machine whose CUDA libraries came with PyTorch (pip's nvidia-cudnn-cu13, nvidia-nccl-cu13 and
nvidia-cuda-nvrtc) has them in site-packages, not beside the CUDA toolkit: each wheel is a folder
under site-packages/nvidia/ with include/ and lib/ inside. CMakeLists.txt runs this script with the
configured Python (ZINF_PYTHON, default python3 on PATH) after it has looked beside the toolkit and
in the system, so the Python that holds the wheels is the one to name.

Usage: scripts/cuda-libs.py [--json]
Prints one line per library found, `name|include dir|library file`, the first match along Python's
sys.path (PYTHONPATH first, then the environment's site-packages); --json prints the same as an
object. Finds nothing without error: a machine without the wheels prints no lines and exits 0.
"""
import glob
import json
import os
import sys

# Each library: the header that proves the include folder, the library file names (the wheels ship
# only the versioned name), and the folders under nvidia/ that hold it. CUDA 13's toolkit wheels put
# their files under nvidia/cu13/; cuDNN and NCCL keep folders of their own.
LIBRARIES = {
    "cudnn": ("cudnn_graph.h", ["libcudnn.so.9"], ["cudnn", "cu13"]),
    "nccl": ("nccl.h", ["libnccl.so.2"], ["nccl", "cu13"]),
    "nvrtc": ("nvrtc.h", ["libnvrtc.so.13", "libnvrtc.so.12"], ["cu13", "cuda_nvrtc"]),
}


def find(name):
    header, files, folders = LIBRARIES[name]
    for entry in sys.path:
        if not entry or not os.path.isdir(os.path.join(entry, "nvidia")):
            continue
        for folder in folders:
            root = os.path.join(entry, "nvidia", folder)
            include = os.path.join(root, "include")
            if not os.path.isfile(os.path.join(include, header)):
                continue
            for lib_dir in ("lib", "lib64"):
                for f in files:
                    path = os.path.join(root, lib_dir, f)
                    if os.path.isfile(path):
                        return include, path
                # a later minor version's name (libnvrtc.so.13 may be absent, libnvrtc.so.13.1 there)
                for f in files:
                    hits = sorted(glob.glob(os.path.join(root, lib_dir, f + ".*")))
                    if hits:
                        return include, hits[0]
    return None


def main(argv):
    if argv not in ([], ["--json"]):
        print("usage: scripts/cuda-libs.py [--json]", file=sys.stderr)
        return 2
    found = {n: find(n) for n in LIBRARIES}
    found = {n: v for n, v in found.items() if v}
    if argv == ["--json"]:
        print(json.dumps({n: {"include": i, "library": l} for n, (i, l) in found.items()}))
    else:
        for n, (i, l) in found.items():
            print(f"{n}|{i}|{l}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
