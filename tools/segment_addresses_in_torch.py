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
    from replay_trace_in_torch import configure, run_event
    d = json.load(open(path))
    torch = configure(d)
    torch.cuda.memory._record_memory_history(max_entries=1000000)
    live, first_mismatch = {}, None
    for k, ev in enumerate(d["events"]):
        err = run_event(torch, ev, live)
        if first_mismatch is None:
            got = torch.cuda.memory_stats()
            if err != d["expected"]["steps"][k]["error"]:
                first_mismatch = (k, "error", err, d["expected"]["steps"][k]["error"])
            for key, v in d["expected"]["steps"][k]["stats"].items():
                if first_mismatch is None and got.get(key) != v:
                    first_mismatch = (k, key, got.get(key), v)
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
                o = subprocess.run([sys.executable, __file__, "--trace", os.path.join(tdir, f)],
                                   capture_output=True, text=True, check=True)
                res["traces"].append(json.loads(o.stdout))
        env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
        for seed in range(24):
            o = subprocess.run([sys.executable, __file__, "--raw", str(seed)],
                               capture_output=True, text=True, env=env, check=True)
            res["raw"].append(json.loads(o.stdout))
        json.dump(res, open(out, "w"))
        for t in res["traces"]:
            print(t["name"], "stats as recorded" if t["first_mismatch"] is None else t["first_mismatch"])
