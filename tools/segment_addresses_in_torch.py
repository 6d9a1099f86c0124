# Records the CUDA driver's segment addresses, to learn where it places cudaMallocs (kiln models
# the rule in src/alloc/vaspace.rs). Run on a CUDA machine with PyTorch:
#   python3 tools/segment_addresses_in_torch.py tests/fixtures OUT.json
# - every trace is replayed in a fresh process under its own alloc_conf and memory limit (the
#   configuration changes which segments exist), its statistics are checked against the
#   recorded ones after every event, and its segment_alloc/segment_free addresses are kept;
# - 24 random cudaMalloc/cudaFree sequences (caching off) give the driver's placement alone.
# tests/fixtures/cuda/segments.json holds a run's addresses in MiB above each sequence's lowest;
# the VaSpace tests replay them.
import json, os, random, subprocess, sys

def trace(path):
    import torch
    d = json.load(open(path))
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=1000000)
    if d["memory_limit_bytes"]:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(d["memory_limit_bytes"] / total)
    live, first_mismatch = {}, None
    for k, ev in enumerate(d["events"]):
        if ev["op"] == "alloc":
            try:
                live[ev["id"]] = torch.empty(ev["size"], dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                pass
        elif ev["op"] == "free":
            live.pop(ev["id"], None)
        elif ev["op"] == "empty_cache":
            torch.cuda.empty_cache()
        elif ev["op"] == "reset_peak":
            torch.cuda.reset_peak_memory_stats()
        if first_mismatch is None:
            got = torch.cuda.memory_stats()
            for key, v in d["expected"]["steps"][k]["stats"].items():
                if got.get(key) != v:
                    first_mismatch = (k, key, got.get(key), v)
                    break
    events = torch.cuda.memory._snapshot()["device_traces"][0]
    segs = [(t["action"], t["addr"], t["size"]) for t in events
            if t["action"] in ("segment_alloc", "segment_free")]
    return {"name": d["name"], "segments": segs, "first_mismatch": first_mismatch}

def raw(seed):
    import torch
    rng, live, log = random.Random(seed), {}, []
    torch.cuda.init()
    for i in range(300):
        if live and (rng.random() < 0.45 or len(live) > 40):
            t = live.pop(rng.choice(list(live)))
            log.append(("F", t.data_ptr(), t.numel()))
            del t
        else:
            n = rng.choice([2, 2, 2, 4, 6, 8, 20, 20, 20, 22, 24, 34, 40, 64, 100]) << 20
            live[i] = torch.empty(n, dtype=torch.uint8, device="cuda")
            log.append(("A", live[i].data_ptr(), n))
    return {"seed": seed, "log": log}

if __name__ == "__main__":
    if sys.argv[1] == "--trace":
        print(json.dumps(trace(sys.argv[2])))
    elif sys.argv[1] == "--raw":
        print(json.dumps(raw(int(sys.argv[2]))))
    else:
        tdir, out = sys.argv[1], sys.argv[2]
        res = {"traces": [], "raw": []}
        for f in sorted(os.listdir(tdir)):
            if f.endswith(".json"):
                env = dict(os.environ)
                conf = json.load(open(os.path.join(tdir, f)))["alloc_conf"]
                if conf:
                    env["PYTORCH_CUDA_ALLOC_CONF"] = conf
                o = subprocess.run([sys.executable, __file__, "--trace", os.path.join(tdir, f)],
                                   capture_output=True, text=True, env=env, check=True)
                res["traces"].append(json.loads(o.stdout))
        env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
        for seed in range(24):
            o = subprocess.run([sys.executable, __file__, "--raw", str(seed)],
                               capture_output=True, text=True, env=env, check=True)
            res["raw"].append(json.loads(o.stdout))
        json.dump(res, open(out, "w"))
        for t in res["traces"]:
            print(t["name"], "stats as recorded" if t["first_mismatch"] is None else t["first_mismatch"])
