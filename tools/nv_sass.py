#!/usr/bin/env python3
"""NVIDIA's machine code (SASS) of kiln's kernels, from the Vulkan driver's pipeline cache.

NVIDIA's Vulkan driver gives no internal representation through
VK_KHR_pipeline_executable_properties, but its pipeline cache data holds the compiled code.
`examples/shader_stats` writes that data per kernel (`KILN_STATS_CACHE=DIR`); this script
turns each blob into the raw instruction binary that CUDA's `nvdisasm -b SM90` lists.

    KILN_STATS_ADAPTER=nvidia KILN_STATS_CACHE=/tmp/cache \\
        cargo run --release --example shader_stats -- matmul128_vec4
    python3 tools/nv_sass.py /tmp/cache /tmp/sass [--nvdisasm PATH] [--arch SM90]

The layout was read off driver 580.159.04 (H100), not from any documentation: after the
Vulkan cache header, a zstd frame (magic 28 b5 2f fd) holds an "NVDANVVMNVuc" container whose
u32 at 0x4c is the code's size and u32 at 0x50 its offset; the code starts 8 bytes past that
offset. Decompression uses the `zstd` command (Debian's `zstd`); `nvdisasm` ships with the
CUDA toolkit and with Triton (`triton/backends/nvidia/bin/nvdisasm`). Without `nvdisasm`, the
raw `.sass.bin` files are written for listing elsewhere.
"""

import argparse
import os
import shutil
import struct
import subprocess
import sys

ZSTD_MAGIC = bytes.fromhex("28b52ffd")
CONTAINER = b"NVDANVVMNVuc"


def raw_code(blob: bytes) -> bytes:
    start = blob.find(ZSTD_MAGIC)
    if start < 0:
        raise ValueError("no zstd frame in the cache data")
    out = subprocess.run(
        ["zstd", "-d", "-q", "-c"], input=blob[start:], capture_output=True, check=True
    ).stdout
    if not out.startswith(CONTAINER):
        raise ValueError(f"unknown container {out[:12]!r}")
    size, offset = struct.unpack_from("<II", out, 0x4C)
    code = out[offset + 8 : offset + size]
    return code[: len(code) // 16 * 16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm"))
    ap.add_argument("--arch", default="SM90")
    args = ap.parse_args()
    if shutil.which("zstd") is None:
        print("nv_sass: needs the zstd command", file=sys.stderr)
        return 1
    os.makedirs(args.out_dir, exist_ok=True)
    for name in sorted(os.listdir(args.cache_dir)):
        if not name.endswith(".bin"):
            continue
        kernel = name[: -len(".bin")]
        try:
            code = raw_code(open(os.path.join(args.cache_dir, name), "rb").read())
        except (ValueError, subprocess.CalledProcessError) as e:
            print(f"{kernel}: {e}")
            continue
        raw = os.path.join(args.out_dir, kernel + ".sass.bin")
        open(raw, "wb").write(code)
        line = f"{kernel}: {len(code) // 16} instructions"
        if args.nvdisasm:
            listing = subprocess.run(
                [args.nvdisasm, "-b", args.arch, raw], capture_output=True, text=True
            )
            text = listing.stdout + listing.stderr
            open(os.path.join(args.out_dir, kernel + ".sass"), "w").write(text)
            ops = []
            for l in text.splitlines():
                words = [w for w in l.split()[1:] if not w.startswith("@")]
                if l.lstrip().startswith("/*") and words:
                    ops.append(words[0])
            for op in ("FFMA", "LDS", "LDG", "STS", "BAR"):
                line += f", {op} {sum(o.startswith(op) for o in ops)}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
