# Replays a trace in PyTorch with memory history on, and prints every segment_alloc/free with
# its CUDA address (relative to the first segment), to learn the driver's placement rule.
import json, sys, torch
d = json.load(open(sys.argv[1]))
torch.cuda.init()
torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
live = {}
marks = []
for k, ev in enumerate(d["events"]):
    marks.append(k)
    if ev["op"] == "alloc":
        live[ev["id"]] = torch.empty(ev["size"], dtype=torch.uint8, device="cuda")
    elif ev["op"] == "free":
        live.pop(ev["id"], None)
    elif ev["op"] == "empty_cache":
        torch.cuda.empty_cache()
    elif ev["op"] == "reset_peak":
        torch.cuda.reset_peak_memory_stats()
snap = torch.cuda.memory._snapshot()
tr = snap["device_traces"][0]
base = None
for t in tr:
    if t["action"] in ("segment_alloc", "segment_free"):
        if base is None:
            base = t["addr"]
        print(t["action"], hex(t["addr"] - base) if t["addr"] >= base else "-" + hex(base - t["addr"]), t["size"])
