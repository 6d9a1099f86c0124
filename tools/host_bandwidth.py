#!/usr/bin/env python3
# Run on the device: python3 tools/host_bandwidth.py (needs PyTorch, which the device has).
# Host memory bandwidth ceiling for the shared-memory all-reduce: per process, 80 MB f32
# copy (read S + write S) and add (read 2S + write S), with T threads, P processes at once.
import sys, time, torch, multiprocessing as mp
def work(t, q, barrier):
    torch.set_num_threads(t)
    n = 80150568 // 4
    a, b, c = torch.rand(n), torch.rand(n), torch.empty(n)
    c.copy_(a); torch.add(a, b, out=c)
    barrier.wait()
    res = {}
    for name, f, traffic in [("copy", lambda: c.copy_(a), 2), ("add", lambda: torch.add(a, b, out=c), 3)]:
        ts = []
        for _ in range(15):
            t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        ts.sort(); m = ts[len(ts)//2]
        res[name] = (m * 1e3, traffic * n * 4 / m / 1e9)
    q.put(res)
if __name__ == "__main__":
    for procs, threads in [(1, 1), (1, 6), (2, 1), (2, 4), (2, 6), (2, 8)]:
        q = mp.Queue(); bar = mp.Barrier(procs)
        ps = [mp.Process(target=work, args=(threads, q, bar)) for _ in range(procs)]
        [p.start() for p in ps]; [p.join() for p in ps]
        rs = [q.get() for _ in ps]
        print(f"{procs} proc x {threads} threads: " + "; ".join(
            f"{k} {r[k][0]:.2f} ms {r[k][1]:.1f} GB/s" for r in rs for k in r))
