"""Checks that PyTorch's memory tools open a kiln snapshot, as they open PyTorch's own.

    python tools/check_memory_viz.py SNAPSHOT.pickle [OUT_DIR]

Runs `python -m torch.cuda._memory_viz stats|trace|trace_plot|segment_plot` on the file (the
commands the issue names; `segments`/`memory` flamegraphs fetch a script from the internet and
are left out), checks that each exits 0 and prints or writes what it should, and loads the file
with torch's own helpers the browser viewer's way (trace_plot embeds the pickle for
pytorch.org/memory_viz's JavaScript). Prints a short report; exits 1 on the first failure.
"""
import os
import pickle
import subprocess
import sys

import torch  # noqa: F401  (fails early where PyTorch is missing)

snap_path = sys.argv[1]
out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.abspath(snap_path))
os.makedirs(out_dir, exist_ok=True)
print(f"torch {torch.__version__}; snapshot {snap_path} ({os.path.getsize(snap_path)} bytes)")

with open(snap_path, "rb") as f:
    snap = pickle.load(f)
traces = snap["device_traces"]
print(f"segments {len(snap['segments'])}, trace entries {[len(t) for t in traces]}")


def run(*args):
    cmd = [sys.executable, "-m", "torch.cuda._memory_viz", *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAILED: {' '.join(args)}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
        sys.exit(1)
    return r.stdout


stats = run("stats", snap_path)
print("== stats (first lines)")
print("\n".join(stats.splitlines()[:12]))
trace = run("trace", snap_path)
lines = trace.splitlines()
print(f"== trace: {len(lines)} lines; first and last:")
print("\n".join(lines[:4] + ["..."] + lines[-3:]))
for kind in ("trace_plot", "segment_plot"):
    out = os.path.join(out_dir, f"kiln_{kind}.html")
    run(kind, snap_path, "-o", out)
    size = os.path.getsize(out)
    if size < 1000:
        print(f"FAILED: {kind} wrote only {size} bytes")
        sys.exit(1)
    print(f"== {kind}: {out} ({size} bytes)")
print("OK: torch.cuda._memory_viz stats, trace, trace_plot and segment_plot open the snapshot")
