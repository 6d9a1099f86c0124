// The key and value tiles the query-row passes (`flash_attn_fwd.wgsl`, `flash_attn_dq.wgsl`)
// walk: BT rows of each staged in workgroup memory, and under causality no tile past the
// workgroup's last query.
var<workgroup> kt: array<vec4<f32>, BT * DP4>;
var<workgroup> vt: array<vec4<f32>, BT * DP4>;

// The first key no query of the workgroup from `row0` sees.
fn key_end(row0: u32) -> u32 {
    if (p.flags & 1u) != 0u {
        return min(p.lk, row0 + WG);
    }
    return p.lk;
}

// Vectors of each operand an invocation stages a trip, every load issued before the first
// store: 4 in the forward pass, where a vector a trip left each trip waiting on its own loads
// (eight trips a tile at DP 64 in NVIDIA's code; 11.7 -> 13.0 TFLOP/s on the H200), 1 in the
// dQ pass, where the four vectors' registers rolled the pass's loops (`kernels/attention.rs`).
const SU: u32 = {{SU}}u;

// Stages keys and values j0 .. j0 + BT of (b, h) `n`, invocation `li` of the workgroup taking
// every NI-th vec4, SU of each a trip; called by the whole workgroup.
fn stage_kv(n: u32, j0: u32, li: u32) {
    workgroupBarrier();
    for (var e = li; e < BT * DP4; e += SU * NI) {
        var kv: array<vec4<f32>, SU>;
        var vv: array<vec4<f32>, SU>;
        for (var u = 0u; u < SU; u++) {
            let eu = e + u * NI;
            kv[u] = k4(n, j0 + eu / DP4, eu % DP4);
            vv[u] = v4(n, j0 + eu / DP4, eu % DP4);
        }
        for (var u = 0u; u < SU; u++) {
            let eu = e + u * NI;
            if eu < BT * DP4 {
                kt[eu] = kv[u];
                vt[eu] = vv[u];
            }
        }
    }
    workgroupBarrier();
}
