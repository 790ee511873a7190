#!/usr/bin/env bash
# Lays out, from the CUDA toolkit's own files, the two trees of a machine whose cuDNN, NCCL and NVRTC
# came as NVIDIA's Python wheels (as PyTorch installs them) rather than beside the toolkit:
#   DEST/site/nvidia/cudnn/{include,lib}  cuDNN's headers and libraries (nvidia-cudnn-cu13's layout)
#   DEST/site/nvidia/nccl/{include,lib}   NCCL's (nvidia-nccl-cu13's)
#   DEST/site/nvidia/cu13/{include,lib}   NVRTC's (nvidia-cuda-nvrtc's, CUDA 13)
#   DEST/cuda-include                     the toolkit's headers without cuDNN's, for an executor build
#                                         (-DZINF_CUDA_INCLUDE=DEST/cuda-include)
# Every file is a symbolic link to the toolkit's real one, and the libraries go by the versioned
# names the wheels ship (libcudnn.so.9, libnccl.so.2, libnvrtc.so.13). Put DEST/site on PYTHONPATH
# to make it the first place Python finds them.
# Usage: tests/scripts/fake_cuda_wheels.sh DEST [CUDA_ROOT]   (CUDA_ROOT default /usr/local/cuda)
set -euo pipefail
dest="$1"
cuda="${2:-/usr/local/cuda}"
inc="$cuda/include"
lib="$(readlink -f "$cuda/lib64")"
[ -f "$inc/cudnn_graph.h" ] && compgen -G "$lib/libcudnn.so.9*" > /dev/null || {
  echo "fake_cuda_wheels: no cuDNN 9 beside the toolkit at $cuda to lay out as a wheel" >&2
  exit 1
}
rm -rf "$dest"
site="$dest/site/nvidia"
mkdir -p "$site/cudnn/include" "$site/cudnn/lib" "$site/nccl/include" "$site/nccl/lib" \
  "$site/cu13/include" "$site/cu13/lib" "$dest/cuda-include"
for pkg in cudnn nccl cu13; do : > "$site/$pkg/__init__.py"; done
ln -s "$inc"/cudnn*.h "$site/cudnn/include/"
# Every cuDNN library by its versioned name (libcudnn.so.9, libcudnn_graph.so.9, ...): cuDNN opens
# its engine libraries itself at run time.
for f in "$lib"/libcudnn*.so.9; do ln -s "$(readlink -f "$f")" "$site/cudnn/lib/$(basename "$f")"; done
if [ -f "$inc/nccl.h" ] && [ -e "$lib/libnccl.so.2" ]; then
  ln -s "$inc/nccl.h" "$site/nccl/include/"
  ln -s "$(readlink -f "$lib/libnccl.so.2")" "$site/nccl/lib/libnccl.so.2"
fi
if [ -f "$inc/nvrtc.h" ] && [ -e "$lib/libnvrtc.so.13" ]; then
  ln -s "$inc/nvrtc.h" "$site/cu13/include/"
  for f in "$lib"/libnvrtc*.so.13*; do ln -s "$(readlink -f "$f")" "$site/cu13/lib/$(basename "$f")"; done
fi
# The toolkit's headers, every one but cuDNN's.
for f in "$inc"/*; do
  case "$(basename "$f")" in cudnn*) continue ;; esac
  ln -s "$f" "$dest/cuda-include/"
done
