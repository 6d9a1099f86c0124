#!/usr/bin/env bash
# The data-parallel scaling figure on a device machine without network access, with
# Open MPI carried as Debian packages. Here, once:
#   mkdir -p .mpi && (cd .mpi && apt-get download libopenmpi3 openmpi-bin openmpi-common \
#     libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libhwloc15 libibverbs1 libnl-3-200 \
#     libnl-route-3-200 libpmix2 libpsm-infinipath1 libpsm2-2 libucx0 libmunge2 librdmacm1 \
#     libnuma1 libatomic1 libltdl7 libudev1 libhwloc-plugins)
#   cargo build --release --features nccl --example ddp_scaling && cp target/release/examples/ddp_scaling .dev/
# and, for the NCCL tests (two NVIDIA GPUs), the distributed test binary as .dev/distributed:
#   cargo test --release --features nccl --test distributed --no-run  (the path it prints)
# Then on the device (carry .gl, .dev and .mpi): bash tools/ddp_scaling_on_device.sh [RANKS]
# (binaries may be carried xz-compressed as .dev/NAME.xz: they are unpacked first).
# It prints, per model, the step with DDP and inside no_sync, the time all-reduce adds and the
# samples per second, for 1 rank and for RANKS ranks (one per GPU), the latter through NCCL
# where it opens (NVIDIA GPUs, libcuda and libnccl there) and again through MPI; the ratio of
# the samples per second is the scaling figure.
set -euo pipefail
ranks=${1:-2}
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
mkdir -p /opt/mpi
for f in .mpi/*.deb; do dpkg -x "$f" /opt/mpi; done
# The tests call `mpirun`, which Debian makes an alternatives link that dpkg -x leaves out.
ln -sf orterun /opt/mpi/usr/bin/mpirun
export OPAL_PREFIX=/opt/mpi/usr PATH=/opt/mpi/usr/bin:$PATH
for f in .dev/ddp_scaling.xz .dev/distributed.xz; do
  if [ -f "$f" ]; then xz -dc "$f" > "${f%.xz}" && chmod +x "${f%.xz}"; fi
done
export LD_LIBRARY_PATH=/opt/mpi/usr/lib/x86_64-linux-gnu:/opt/mpi/usr/lib/x86_64-linux-gnu/openmpi/lib
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 PMIX_MCA_pcompress_base_silence_warning=1
nvidia-smi -L
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on shared machines
for run in "1 auto" "$ranks auto" "$ranks mpi"; do
  set -- $run
  echo "== $1 rank(s), KILN_DIST_BACKEND=$2"
  KILN_DIST_BACKEND=$2 orterun --allow-run-as-root --bind-to none -n "$1" .dev/ddp_scaling \
    --steps 20 2>&1 | grep -E '^(ddp_scaling|mlp|resnet|\{)'
done
if [ -x .dev/distributed ]; then
  echo "== NCCL tests (2 ranks: NCCL against the host path, collectives, DDP)"
  KILN_TEST_NCCL_OPENS=1 KILN_REQUIRE_GPU=1 .dev/distributed nccl --test-threads 1 2>&1 \
    | grep -E '^test |test result|panicked'
fi
