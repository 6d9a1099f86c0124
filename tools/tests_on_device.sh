#!/usr/bin/env bash
# The whole test suite on a real GPU (CI runs it on lavapipe only). Two halves:
#
#   bash tools/tests_on_device.sh pack     # here: release test binaries, stripped and
#                                          # xz-compressed into .dev/tb (about 50 MiB)
#   bash tools/tests_on_device.sh run      # on the device machine (carry .gl and .dev)
#
# `run` unpacks the Vulkan loader from .gl (the device README's packages), points the loader at
# NVIDIA's ICD, links the build's source directory to this checkout (insta finds its snapshots
# through the path compiled into the binaries) and runs every binary with KILN_REQUIRE_GPU=1,
# one test at a time, printing each binary's result line and its failures. The MPI tests need
# `mpirun` and the `mpi` feature: `tools/ddp_scaling_on_device.sh` covers that path.
# (On 2026-11-27 this found an H100-only failure: 27 of 28 binaries passed.)
set -euo pipefail
case "${1:-}" in
  pack)
    mkdir -p .dev/tb
    rm -f .dev/tb/*.xz
    cargo test --release --no-run --message-format=json 2>/dev/null \
      | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if (m.get("reason") == "compiler-artifact" and m.get("executable")
            and m["profile"]["test"] and m["target"]["kind"] in (["test"], ["lib"])):
        print(m["target"]["name"], m["executable"])' \
      | while read -r name exe; do
          [ "$name" = distributed ] && continue
          strip -o "/tmp/kiln_tb_$name" "$exe"
          xz -T2 -6 -c "/tmp/kiln_tb_$name" > ".dev/tb/$name.xz"
          rm -f "/tmp/kiln_tb_$name"
        done
    du -sh .dev/tb
    echo "built in $PWD; on the device the binaries look for it there"
    ;;
  run)
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export XDG_RUNTIME_DIR=/tmp XDG_CACHE_HOME=/tmp/kiln_tb_cache
    nvidia-smi -L
    root=${KILN_BUILD_ROOT:-/work/main}
    if [ ! -e "$root" ]; then
      mkdir -p "$(dirname "$root")"
      ln -s "$PWD" "$root"
    fi
    mkdir -p /tmp/kiln_tb
    for f in .dev/tb/*.xz; do
      n=$(basename "$f" .xz)
      xz -dc "$f" > "/tmp/kiln_tb/$n"
      chmod +x "/tmp/kiln_tb/$n"
    done
    for n in $(ls /tmp/kiln_tb); do
      s=$(date +%s)
      out=$(cd "$root" && KILN_REQUIRE_GPU=1 timeout 300 "/tmp/kiln_tb/$n" --test-threads=1 2>&1) && rc=0 || rc=$?
      echo "== $n rc=$rc $(( $(date +%s) - s )) s: $(echo "$out" | grep -E '^test result' | tail -1)"
      echo "$out" | grep -E "FAILED|panicked" -A4 | cut -c1-400 | head -24 || true
    done
    ;;
  *)
    echo "usage: bash tools/tests_on_device.sh pack|run" >&2
    exit 2
    ;;
esac
