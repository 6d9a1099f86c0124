# Replays an allocator trace in PyTorch itself, under the trace's own alloc_conf and memory
# limit, and reports the first statistic that differs from the recorded one: is PyTorch's own
# result reproducible? Optional warm-up perturbs CUDA's address space first (allocate and free
# some segments, then empty_cache).
#   python3 tools/replay_trace_in_torch.py TRACE.json [WARM_MIB]
import json, os, sys


def configure(d):
    """Applies the trace's alloc_conf and memory limit; call before CUDA is first used."""
    if d["alloc_conf"]:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = d["alloc_conf"]
    import torch
    torch.cuda.init()
    if d["memory_limit_bytes"]:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(d["memory_limit_bytes"] / total)
    return torch


def run_event(torch, ev, live):
    """Runs one event; returns "oom" where PyTorch raised out-of-memory, else None."""
    try:
        if ev["op"] == "alloc":
            live[ev["id"]] = torch.empty(ev["size"], dtype=torch.uint8, device="cuda")
        elif ev["op"] == "free":
            live.pop(ev["id"], None)
        elif ev["op"] == "empty_cache":
            torch.cuda.empty_cache()
        elif ev["op"] == "reset_peak":
            torch.cuda.reset_peak_memory_stats()
    except torch.OutOfMemoryError:
        return "oom"
    return None


if __name__ == "__main__":
    path = sys.argv[1]
    warm = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    d = json.load(open(path))
    torch = configure(d)
    if warm:
        keep = [torch.empty(warm << 20, dtype=torch.uint8, device="cuda") for _ in range(3)]
        del keep
        torch.cuda.synchronize(); torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(); torch.cuda.reset_accumulated_memory_stats()
    live = {}
    for k, (ev, step) in enumerate(zip(d["events"], d["expected"]["steps"])):
        err = run_event(torch, ev, live)
        stats = torch.cuda.memory_stats()
        bad = [key for key, v in step["stats"].items() if stats.get(key) != v and not key.startswith("num_device") and key != "num_sync_all_streams"]
        if err != step["error"] or bad:
            print(f"{os.path.basename(path)} warm={warm}: DIFFERS at event {k}: {bad[:3]} got {[stats.get(b) for b in bad[:3]]} want {[step['stats'][b] for b in bad[:3]]}")
            break
    else:
        print(f"{os.path.basename(path)} warm={warm}: matches all {len(d['events'])} events")
