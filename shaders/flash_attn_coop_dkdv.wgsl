// Flash attention's backward, second pass, on cooperative matrices: the key and value
// gradients for 64 keys of one (b, h), 16 per subgroup, which holds its keys and values as
// matrix operands. Per tile of BT queries (under causality from the first tile that sees the
// workgroup's keys; double-buffered, `flash_attn_coop_common.wgsl`): the queries and output
// gradients are staged, S^T = k q^T and
// dP^T = v dO^T leave through the subgroup's patches, the lanes (two per key) form
// P^T * keep into `ps` and dS^T = P^T * (dP^T * keep - delta) into `ps2`, rounded to f16, and
// the subgroup accumulates dV += (P * keep)^T dO and dK += dS^T q in f32 matrices.
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> q: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> k: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> v: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> mask: array<f32>;
@group(0) @binding(4) var<storage, read_write> dout: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> dk: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read_write> dv: array<vec4<u32>>;

{{COOP_SHARED}}

var<workgroup> res2: array<vec4<f32>, 64u * PW4>;
var<workgroup> ps2: array<vec4<f16>, 64u * RP4>;
// The log-sum-exps and deltas of a tile, in two buffers as the tiles are.
var<workgroup> lt: array<vec4<f32>, BT / 2u>;
var<workgroup> dt: array<vec4<f32>, BT / 2u>;

// Vector c8 of the output gradient's row i (zeros past lq and the head dim).
fn dout8(n: u32, i: u32, c8: u32) -> vec4<u32> {
    let x = dout[row_out(n, min(i, p.lq - 1u), p.lq, p.dv / 8u) + min(c8, p.dv / 8u - 1u)];
    return select(vec4<u32>(0u), x, vec4<bool>(i < p.lq && c8 * 8u < p.dv));
}

// Queries i0 .. i0 + BT of (b, h) `n` (from q's base `qb`) and their output gradients.
fn load_qo(n: u32, qb: u32, i0: u32, li: u32) -> Tile {
    var t: Tile;
    for (var s = 0u; s < NPT; s++) {
        let e = min(li + s * 128u, BT * DP8 - 1u);
        t.a[s] = q8(qb, i0 + e / DP8, e % DP8);
        t.b[s] = dout8(n, i0 + e / DP8, e % DP8);
    }
    return t;
}

// The log-sum-exp and delta of query i0 + li of a tile, for the invocations li < BT.
fn load_stats(n: u32, i0: u32, li: u32) -> vec2<f32> {
    let i = i0 + min(li, BT - 1u);
    let ic = min(i, p.lq - 1u);
    return vec2<f32>(select(MASKED, stats[n * p.lq + ic], i < p.lq),
        stats[p.n * p.lq + n * p.lq + ic]);
}

// Stores them into buffer `buf` of `lt` and `dt`.
fn put_stats(x: vec2<f32>, buf: u32, li: u32) {
    if li < BT {
        let at = buf * BT + li;
        lt[at / 4u][at % 4u] = x.x;
        dt[at / 4u][at % 4u] = x.y;
    }
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32,
        @builtin(local_invocation_index) li: u32) {
    let n = head_of(wid);
    let col0 = block_row(wid, p.lk, false);
    let kb = base8(p.k_off, p.k_sb, p.k_sh, n);
    let vb = base8(p.v_off, p.v_sb, p.v_sh, n);
    let qb = base8(p.q_off, p.q_sb, p.q_sh, n);
    for (var e = li; e < 64u * DP8; e += 128u) {
        put8((e / DP8) * RS4 + (e % DP8) * 2u, k8(kb, col0 + e / DP8, e % DP8));
    }
    workgroupBarrier();
{{LOAD_KA}}
    workgroupBarrier();
    for (var e = li; e < 64u * DP8; e += 128u) {
        put8((e / DP8) * RS4 + (e % DP8) * 2u, v8(vb, col0 + e / DP8, e % DP8));
    }
    workgroupBarrier();
{{LOAD_VA}}
    let r = lane / 2u;
    let h = lane % 2u;
    let j = col0 + sg * 16u + r;
    let own = sg * 16u * PW4;
    let mine = own + r * PW4;
    let prow = (sg * 16u + r) * RP4 + h * BH4;
{{ACC_INIT}}
    var i_start = 0u;
    if (p.flags & 1u) != 0u {
        i_start = col0 / BT * BT;
    }
    // The staged k and v are in the subgroups' operands before the first tile overwrites them.
    workgroupBarrier();
    put_tile(load_qo(n, qb, i_start, li), 0u, li);
    put_stats(load_stats(n, i_start, li), 0u, li);
    var next = load_qo(n, qb, i_start + BT, li);
    var next_stats = load_stats(n, i_start + BT, li);
    workgroupBarrier();
    for (var i0 = i_start; i0 < p.lq; i0 += BT) {
        let cur = ((i0 - i_start) / BT) % 2u;
        let kvb = cur * KVB;
        let st = cur * (BT / 4u);
{{SCORES}}
        workgroupBarrier();
        put_tile(next, 1u - cur, li);
        put_stats(next_stats, 1u - cur, li);
        next = load_qo(n, qb, i0 + 2u * BT, li);
        next_stats = load_stats(n, i0 + 2u * BT, li);
        // A tile whose every query sees the key, with no mask or dropout, skips the per-score
        // checks.
        let clear = (p.flags & 6u) == 0u && j < p.lk && i0 + BT <= p.lq
            && ((p.flags & 1u) == 0u || j <= i0);
        for (var c = 0u; c < BH4; c++) {
            let s4 = res[mine + h * BH4 + c];
            let dp4 = res2[mine + h * BH4 + c];
            var pz = vec4<f32>(0.0);
            var ds = vec4<f32>(0.0);
            if clear {
                pz = exp(s4 * p.scale - lt[st + h * BH4 + c]);
                ds = pz * (dp4 - dt[st + h * BH4 + c]);
            } else {
                for (var e = 0u; e < 4u; e++) {
                    let ii = h * BH + c * 4u + e;
                    let i = i0 + ii;
                    let lse = lt[st + ii / 4u][ii % 4u];
                    if visible(i, j) && lse > DEAD {
                        let pr = exp(s4[e] * p.scale + mask_at(n, i, j) - lse);
                        let z = keep(n, i, j);
                        pz[e] = pr * z;
                        ds[e] = pr * (dp4[e] * z - dt[st + ii / 4u][ii % 4u]);
                    }
                }
            }
            ps[prow + c] = vec4<f16>(pz);
            ps2[prow + c] = vec4<f16>(ds);
        }
        workgroupBarrier();
{{ACCUMULATE}}
    }
{{EPILOGUE}}
}
