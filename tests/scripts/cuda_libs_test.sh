#!/usr/bin/env bash
# cuDNN, NCCL and NVRTC found in NVIDIA's Python wheels (cmake/CudaLibraries.cmake,
# scripts/cuda-libs.py), from a tree laid out like the wheels with the toolkit's real files linked in
# (tests/scripts/fake_cuda_wheels.sh):
#   - scripts/cuda-libs.py finds each library in the wheel layout and nothing in a tree without headers;
#   - a CUDA build configured to look only in wheels (ZINF_CUDA_LIBS_FROM=wheel) links the wheels'
#     cuDNN and NCCL and writes their folders into cuda-libs.env; without the wheels, ZINF_CUDNN=ON
#     stops the configure with one line;
#   - an executor build whose CUDA headers lack cuDNN's finds no cuDNN beside the toolkit, and finds
#     the wheel's headers when the wheels are searched.
# Usage: tests/scripts/cuda_libs_test.sh SOURCE_DIR   (exit 77: no CUDA toolkit with cuDNN here)
set -uo pipefail
src="$1"
cuda=/usr/local/cuda
if [ ! -x "$cuda/bin/nvcc" ] || [ ! -f "$cuda/include/cudnn_graph.h" ]; then
  echo "cuda_libs_test: skipped: no CUDA toolkit with cuDNN at $cuda to lay out as wheels"
  exit 77
fi
work="$(mktemp -d)"
trap "${KEEP_WORK:+:} rm -rf $work" EXIT
fails=0
check() {  # description, then a command that must succeed
  local what="$1"
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fails=$((fails + 1)); fi
}
bash "$src/tests/scripts/fake_cuda_wheels.sh" "$work/fake" "$cuda" || exit 1
site="$work/fake/site"

# The finder on its own.
found="$(PYTHONPATH="$site" python3 "$src/scripts/cuda-libs.py")"
check "cuda-libs.py finds cuDNN in the wheel layout" grep -qx "cudnn|$site/nvidia/cudnn/include|$site/nvidia/cudnn/lib/libcudnn.so.9" <<< "$found"
check "cuda-libs.py finds NCCL in the wheel layout" grep -qx "nccl|$site/nvidia/nccl/include|$site/nvidia/nccl/lib/libnccl.so.2" <<< "$found"
check "cuda-libs.py finds NVRTC under nvidia/cu13" grep -q "^nvrtc|$site/nvidia/cu13/include|$site/nvidia/cu13/lib/libnvrtc.so.13" <<< "$found"
mkdir -p "$work/noheaders/nvidia/cudnn/lib"
ln -s "$site/nvidia/cudnn/lib/libcudnn.so.9" "$work/noheaders/nvidia/cudnn/lib/"
check "cuda-libs.py takes no library without its header" \
  test -z "$(PYTHONPATH="$work/noheaders" python3 -S "$src/scripts/cuda-libs.py")"
check "cuda-libs.py refuses an unknown argument (exit 2)" \
  bash -c "python3 '$src/scripts/cuda-libs.py' --nope 2> /dev/null; [ \$? = 2 ]"

# A CUDA build that looks in wheels only.
configure() {  # build dir, then cmake arguments; the configure's output in DIR.log
  local dir="$1"
  shift
  cmake -S "$src" -B "$dir" -DZINF_BUILD_BENCH=OFF -DZINF_BUILD_TESTS=OFF -DZINF_CCACHE=OFF -DZINF_MPI=OFF "$@" > "$dir.log" 2>&1
}
cache() { sed -n "s/^$2:[A-Z]*=//p" "$1/CMakeCache.txt"; }
if PYTHONPATH="$site" configure "$work/gpu" -DZINF_CUDA=ON -DZINF_CUDNN=ON -DZINF_NCCL=ON -DZINF_CUDA_LIBS_FROM=wheel; then
  check "the CUDA build takes cuDNN from the wheel" test "$(cache "$work/gpu" ZINF_CUDNN_LIBRARY)" = "$site/nvidia/cudnn/lib/libcudnn.so.9"
  check "the CUDA build takes cuDNN's headers from the wheel" test "$(cache "$work/gpu" ZINF_CUDNN_INCLUDE)" = "$site/nvidia/cudnn/include"
  check "the CUDA build takes NCCL from the wheel" test "$(cache "$work/gpu" ZINF_NCCL_LIBRARY)" = "$site/nvidia/nccl/lib/libnccl.so.2"
  check "the configure says where each came from" grep -q "CUDNN: wheel ($site/nvidia/cudnn/include)" "$work/gpu.log"
  for d in cudnn nccl cu13; do
    check "cuda-libs.env puts the wheel's $d/lib on LD_LIBRARY_PATH" grep -q "$(readlink -f "$site/nvidia/$d/lib")" "$work/gpu/cuda-libs.env"
  done
  check "cuda-libs.env is a shell file that sets LD_LIBRARY_PATH" \
    bash -c ". '$work/gpu/cuda-libs.env' && [[ \"\$LD_LIBRARY_PATH\" == *nvidia/cudnn/lib* ]]"
else
  tail -5 "$work/gpu.log"
  check "the CUDA build configures against the wheels" false
fi
rc=0
PYTHONPATH="$work/nowheels" configure "$work/gpu-none" -DZINF_CUDA=ON -DZINF_CUDNN=ON -DZINF_CUDA_LIBS_FROM=wheel || rc=$?
check "ZINF_CUDNN=ON without any cuDNN in the places searched stops the configure" test "$rc" != 0
check "... with one message naming the places and the override" \
  grep -q "ZINF_CUDNN=ON but cuDNN 9 (cudnn_graph.h) was not found in wheel .*-DZINF_CUDNN_INCLUDE" \
  <(tr -s ' \n' ' ' < "$work/gpu-none.log")
rc=0
configure "$work/bad-place" -DZINF_CUDA_LIBS_FROM="toolkit;elsewhere" || rc=$?
check "an unknown place in ZINF_CUDA_LIBS_FROM is refused" \
  bash -c "[ $rc != 0 ] && grep -q \"ZINF_CUDA_LIBS_FROM: 'elsewhere' is not a place to look\" '$work/bad-place.log'"

# The executor build, its CUDA headers without cuDNN's: none beside the toolkit, the wheel's when
# searched. (Only the wheels: the system's folders may hold the toolkit's files too, as
# /usr/local/include does on some images.)
if PYTHONPATH="$site" configure "$work/exe-toolkit" -DZINF_CUDA_EXECUTOR=ON -DZINF_CUDA_INCLUDE="$work/fake/cuda-include" \
     -DZINF_CUDA_LIBS_FROM=toolkit; then
  check "an executor build with cuDNN hidden from the toolkit's headers has no cuDNN" grep -q "cuDNN OFF" "$work/exe-toolkit.log"
else
  tail -5 "$work/exe-toolkit.log"
  check "the executor build configures without cuDNN" false
fi
if PYTHONPATH="$site" configure "$work/exe-wheel" -DZINF_CUDA_EXECUTOR=ON -DZINF_CUDA_INCLUDE="$work/fake/cuda-include" \
     -DZINF_CUDNN=ON -DZINF_CUDA_LIBS_FROM=wheel; then
  check "the executor build finds cuDNN's headers in the wheel" test "$(cache "$work/exe-wheel" ZINF_CUDNN_INCLUDE)" = "$site/nvidia/cudnn/include"
else
  tail -5 "$work/exe-wheel.log"
  check "the executor build configures against the wheel" false
fi
[ "$fails" = 0 ] && echo "cuda_libs_test: ok" && exit 0
echo "cuda_libs_test: $fails FAILED"
exit 1
