# Records new allocator traces from PyTorch, in the format of ../shared/alloc-traces/README.md:
# random alloc/free/empty_cache/reset_peak sequences under several configurations, each run in
# a fresh process under its alloc_conf and memory limit, with memory_stats() after every event,
# the final memory_summary() and the final segments. Run on a CUDA machine:
#   python3 tools/record_trace_in_torch.py OUT_DIR [COUNT] [EVENTS] [FIRST_SEED] [--small]
# (tests/fixtures/recorded/: `OUT 21 300` and `OUT 14 800 200`, run from tools/; the expandable
# `OUT 10 300 500 --expandable`)
# --small: many small blocks (under 1 MiB, most under 64 KiB) freed and reallocated
# across several 2 MiB segments under roundup_power2_divisions, where best-fit ties between
# segments are decided by address; each recording also keeps the driver's segment addresses
# (segment_alloc / segment_free with addr and size) for finding the placement rule.
import json, math, os, random, subprocess, sys

MB = 1 << 20
CONFIGS = [
    (None, None),
    ("max_split_size_mb:40", None),
    ("roundup_power2_divisions:4", None),
    ("garbage_collection_threshold:0.6", 400 * MB),
    (None, 300 * MB),
    ("max_split_size_mb:20,roundup_power2_divisions:[1:2,64:8,>:1]", None),
    ("max_split_size_mb:64,garbage_collection_threshold:0.8", 500 * MB),
]


SMALL_CONFIGS = [
    ("roundup_power2_divisions:4", None),
    ("roundup_power2_divisions:8", None),
    ("roundup_power2_divisions:[256:4,>:2]", None),
    ("roundup_power2_divisions:2,max_split_size_mb:20", None),
]


# --expandable: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, alone and with the
# other settings, large and small events (seeds alternate), with the layout of every mapped run
# (snapshot segments with their addresses and blocks) and the segment_map / segment_unmap trace.
EXPANDABLE_CONFIGS = [
    ("expandable_segments:True", None),
    ("expandable_segments:True", 300 * MB),
    ("expandable_segments:True,roundup_power2_divisions:4", None),
    ("expandable_segments:True,garbage_collection_threshold:0.6", 400 * MB),
    ("expandable_segments:True,max_split_size_mb:40", None),
]


def small_events(seed, count):
    rng, live, evs, next_id = random.Random(seed), [], [], 1
    for _ in range(count):
        r = rng.random()
        if r < 0.01:
            evs.append({"op": "empty_cache"})
        elif live and (r < 0.48 or len(live) > 120):
            evs.append({"op": "free", "id": live.pop(rng.randrange(len(live)))})
        else:
            hi = 64 << 10 if rng.random() < 0.7 else MB
            size = int(math.exp(rng.uniform(math.log(1), math.log(hi))))
            evs.append({"op": "alloc", "id": next_id, "size": size})
            live.append(next_id)
            next_id += 1
    return evs


def events(seed, count):
    rng, live, evs, next_id = random.Random(seed), [], [], 1
    for _ in range(count):
        r = rng.random()
        if r < 0.02:
            evs.append({"op": "empty_cache"})
        elif r < 0.04:
            evs.append({"op": "reset_peak"})
        elif live and (r < 0.45 or len(live) > 60):
            evs.append({"op": "free", "id": live.pop(rng.randrange(len(live)))})
        else:
            band = rng.random()
            lo, hi = (1, MB) if band < 0.5 else (MB, 10 * MB) if band < 0.85 else (10 * MB, 80 * MB)
            size = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
            evs.append({"op": "alloc", "id": next_id, "size": size})
            live.append(next_id)
            next_id += 1
    return evs


def record(seed, count, small=False, expandable=False):
    from replay_trace_in_torch import configure, run_event
    if expandable:
        conf, limit = EXPANDABLE_CONFIGS[seed % len(EXPANDABLE_CONFIGS)]
        small = seed % 2 == 1
        name = f"recorded_expandable_{seed}"
    else:
        configs = SMALL_CONFIGS if small else CONFIGS
        conf, limit = configs[seed % len(configs)]
        name = f"recorded_small_{seed}" if small else f"recorded_{seed}"
    d = {"name": name, "alloc_conf": conf, "memory_limit_bytes": limit,
         "events": (small_events if small else events)(seed, count)}
    torch = configure(d)
    if small or expandable:
        torch.cuda.memory._record_memory_history(max_entries=1000000)
    live, steps = {}, []
    for ev in d["events"]:
        err = run_event(torch, ev, live)
        steps.append({"event": ev, "error": err, "stats": dict(torch.cuda.memory_stats())})
    segs = []
    for s in torch.cuda.memory_snapshot():
        segs.append({k: s[k] for k in ("total_size", "allocated_size", "active_size",
                                       "requested_size", "segment_type")}
                    | {"blocks": [{k: b[k] for k in ("size", "requested_size", "state")}
                                  for b in s["blocks"]]})
    segs.sort(key=lambda s: s["total_size"])
    d["expected"] = {"steps": steps, "summary": torch.cuda.memory_summary(),
                     "segments_sorted_by_size": segs}
    if small and not expandable:
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        d["segment_addresses"] = [(t["action"], t["addr"], t["size"]) for t in trace
                                  if t["action"] in ("segment_alloc", "segment_free")]
    if expandable:
        snap = torch.cuda.memory._snapshot()
        d["segment_maps"] = [(t["action"], t["addr"], t["size"]) for t in snap["device_traces"][0]
                             if t["action"] in ("segment_map", "segment_unmap",
                                                "segment_alloc", "segment_free")]
        d["expected"]["segments"] = [
            {k: s[k] for k in ("address", "total_size", "allocated_size", "active_size",
                               "requested_size", "segment_type", "is_expandable")}
            | {"blocks": [{k: b[k] for k in ("address", "size", "requested_size", "state")}
                          for b in s["blocks"]]}
            for s in sorted(snap["segments"], key=lambda s: s["address"])]
    return d


if __name__ == "__main__":
    small = "--small" in sys.argv
    expandable = "--expandable" in sys.argv
    flags = ["--small"] * small + ["--expandable"] * expandable
    sys.argv = [a for a in sys.argv if a not in ("--small", "--expandable")]
    if sys.argv[1] == "--one":
        print(json.dumps(record(int(sys.argv[2]), int(sys.argv[3]), small, expandable)))
        sys.exit(0)
    out = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 14
    n_events = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    first = int(sys.argv[4]) if len(sys.argv) > 4 else 100
    os.makedirs(out, exist_ok=True)
    for seed in range(first, first + count):
        o = subprocess.run([sys.executable, __file__, "--one", str(seed), str(n_events)]
                           + flags,
                           capture_output=True, text=True, check=True)
        d = json.loads(o.stdout)
        with open(os.path.join(out, d["name"] + ".json"), "w") as f:
            json.dump(d, f)
        ooms = sum(s["error"] == "oom" for s in d["expected"]["steps"])
        print(d["name"], d["alloc_conf"], d["memory_limit_bytes"], f"{ooms} ooms",
              d["expected"]["steps"][-1]["stats"]["segment.all.allocated"], "segments made")
