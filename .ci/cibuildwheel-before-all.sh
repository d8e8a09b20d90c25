#!/usr/bin/env bash
# cibuildwheel's before-all step, run once inside each manylinux container
# (pyproject.toml's [tool.cibuildwheel.linux]). The CPU wheels need nothing
# beyond the image. With BATCHPART_CUDA=ON (passed in from the host) it puts
# a CUDA 13 toolchain and cuSOLVER/cuBLAS where the container's environment
# points CUDACXX and BATCHPART_CUDA_LIBS_ROOT: NVIDIA's pip wheels, unpacked
# into one prefix (nvidia/cu13/{bin,include,lib}), the layout
# cc/cusolver/cuda.cmake searches. The libraries are only linked against;
# auditwheel leaves them out of the wheel and the [cuda] extra installs them.
set -euo pipefail
mode=$(printf '%s' "${BATCHPART_CUDA:-AUTO}" | tr '[:lower:]' '[:upper:]')
if [ "$mode" != "ON" ]; then
  echo "batchpart: CPU wheel (BATCHPART_CUDA=${BATCHPART_CUDA:-unset}); no CUDA toolchain installed"
  exit 0
fi
python=/opt/python/cp312-cp312/bin/python
"$python" -m pip install --no-cache-dir --target /opt/batchpart-cuda \
  "nvidia-cuda-nvcc>=13,<14" "nvidia-nvvm>=13,<14" "nvidia-cuda-crt>=13,<14" \
  "nvidia-cuda-runtime>=13,<14" "nvidia-cuda-cccl>=13,<14" "nvidia-cuda-culibos>=13,<14" \
  "nvidia-cusolver>=12.0.3.29" "nvidia-cublas>=13.0.0.19"
/opt/batchpart-cuda/nvidia/cu13/bin/nvcc --version
