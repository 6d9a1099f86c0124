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

// Stages keys and values j0 .. j0 + BT of (b, h) `n`, invocation `li` of the workgroup taking
// every WG-th vec4; called by the whole workgroup.
fn stage_kv(n: u32, j0: u32, li: u32) {
    workgroupBarrier();
    for (var e = li; e < BT * DP4; e += WG) {
        kt[e] = k4(n, j0 + e / DP4, e % DP4);
        vt[e] = v4(n, j0 + e / DP4, e % DP4);
    }
    workgroupBarrier();
}
