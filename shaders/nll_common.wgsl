// What `nll.wgsl` and `cross_entropy.wgsl` share besides their immediates (`nll_params.wgsl`):
// the check of a row's target, and the forward's sum over the workgroup (each file declares
// the bindings these read: `labels`, `out`, `total`, `flag`).

var<workgroup> sums: array<f32, 256>;
var<workgroup> counts: array<f32, 256>;

// Row i's target where it counts; -1 where it is ignore_index, or outside [0, C) (which also
// raises the device's assert flag: CUDA's device-side assert).
fn counted_target(i: u32) -> i32 {
    let ti = labels[p.t_off + i * p.st];
    if ti == p.ignore {
        return -1;
    }
    if ti < 0 || u32(ti) >= p.c {
        atomicMax(&flag[0], 1u);
        return -1;
    }
    return ti;
}

// The element of the contiguous [N, C] gradient an invocation of a backward writes: its index
// (N * C or more past the end), row and class.
fn element(gid: vec3<u32>, nw: vec3<u32>) -> vec3<u32> {
    let e = gid.x + gid.y * nw.x * 256u;
    let i = e / p.c;
    return vec3<u32>(e, i, e - i * p.c);
}

// The workgroup's sums and counts added up: the loss (their quotient; 0 / 0 is NaN when every
// target is ignored) and total_weight (the count); for a window of rows (`p.part`), the sums
// so far, the quotient only after the last.
fn finish(t: u32, s: f32, count: f32) {
    sums[t] = s;
    counts[t] = count;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if t < k {
            sums[t] += sums[t + k];
            counts[t] += counts[t + k];
        }
        workgroupBarrier();
    }
    if t == 0u {
        var s = sums[0];
        var c = counts[0];
        if p.part >= 2u {
            s += f32(out[p.out_off]);
            c += total[p.tw_off];
        }
        if p.part == 0u || p.part == 3u {
            s /= c;
        }
        out[p.out_off] = {{T}}(s);
        total[p.tw_off] = c;
    }
}
