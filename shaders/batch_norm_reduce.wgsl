// Per-channel partial sums of batch normalisation over x viewed as [N, C, S] (contiguous; S is
// H*W, counted in `{{V}}` units). Workgroup (c, chunk) sums the chunk's elements of channel c:
// - forward: sum(x - k) and sum((x - k)^2), with k = x[0, c, 0], a shift that keeps the
//   variance's cancellation small (the finalize pass gets k from the extra row);
// - backward: sum(g) and sum(g * (x - mean[c])).
// Output: partials [chunks, C] of vec2<f32>, then (forward) one row [C] of (k, 0).
// With the finalize folded in (the closing lines), the last workgroup of a channel to write its
// partial (counted in the device's arrival counters) also runs the channel's finalize.
{{FIN}}

struct Params {
    c: u32,
    s: u32,
    // Units per channel (N * S) and per chunk.
    m: u32,
    chunk_len: u32,
    x_off: u32,
    g_off: u32,
    mean_off: u32,
    // Where the forward's row of shifts starts (in vec2s).
    k_off: u32,
    pad1: u32,
    pad2: u32,
    pad3: u32,
    pad4: u32,
    // The folded finalize's (`batch_norm_fin.wgsl`).
    fin: Fin,
    pad5: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<{{V}}>;
{{BINDINGS}}

var<workgroup> red: array<vec2<f32>, 256>;

// Unit index of the channel's unit e (of N * S).
fn at(c: u32, e: u32) -> u32 {
    let n = e / p.s;
    return (n * p.c + c) * p.s + (e - n * p.s);
}

{{HELPERS}}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = wg.x;
    let start = wg.y * p.chunk_len;
    let end = min(start + p.chunk_len, p.m);
    {{SHIFT}}
    var acc = vec2<f32>(0.0);
    for (var e = start + l.x; e < end; e += 256u) {
        let i = at(c, e);
        {{ACC}}
    }
    red[l.x] = acc;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w >>= 1u) {
        if l.x < w {
            red[l.x] += red[l.x + w];
        }
        workgroupBarrier();
    }
    if l.x == 0u {
        part[wg.y * p.c + c] = red[0];
        {{EXTRA}}
    }
    {{FINISH}}
}
