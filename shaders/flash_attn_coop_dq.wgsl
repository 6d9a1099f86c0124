// Flash attention's backward, first pass, on cooperative matrices: the query gradient for 64
// query rows of one (b, h), 16 per subgroup. Each lane pair first takes its row's
// delta = dO . O (written after the log-sum-exps, for the second pass); the subgroup holds its
// queries and output gradients as matrix operands. Per tile of BT keys (double-buffered,
// `flash_attn_coop_common.wgsl`): S = q k^T and
// dP = dO v^T leave through the subgroup's patches, the lanes form
// dS = P * (dP * keep - delta) with P = exp(s * scale + mask - lse), rounded to f16 into `ps`,
// and the subgroup accumulates dQ += dS k in f32 matrices, scaled once at the end.
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> q: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> k: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> v: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> mask: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> dout: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> stats: array<f32>;
@group(0) @binding(7) var<storage, read_write> dq: array<vec4<u32>>;

{{COOP_SHARED}}

// The second patch: dP of each subgroup's 16 rows.
var<workgroup> res2: array<vec4<f32>, 64u * PW4>;

// Vector c8 of the row of o (of dout) at vector `b`, zeros past the head dim.
fn o8(b: u32, c8: u32) -> vec4<u32> {
    return select(vec4<u32>(0u), o[b + min(c8, p.dv / 8u - 1u)], vec4<bool>(c8 * 8u < p.dv));
}

fn dout8(b: u32, c8: u32) -> vec4<u32> {
    return select(vec4<u32>(0u), dout[b + min(c8, p.dv / 8u - 1u)], vec4<bool>(c8 * 8u < p.dv));
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32,
        @builtin(local_invocation_index) li: u32) {
    let n = head_of(wid);
    let row0 = block_row(wid, p.lq, true);
    stage_q(n, row0, li);
    workgroupBarrier();
{{LOAD_QA}}
    workgroupBarrier();
    for (var e = li; e < 64u * DP8; e += 128u) {
        let ic = min(row0 + e / DP8, p.lq - 1u);
        put8((e / DP8) * RS4 + (e % DP8) * 2u, dout8(row_out(n, ic, p.lq, p.dv / 8u), e % DP8));
    }
    workgroupBarrier();
{{LOAD_DA}}
    let r = lane / 2u;
    let h = lane % 2u;
    let i = row0 + sg * 16u + r;
    let ic = min(i, p.lq - 1u);
    let own = sg * 16u * PW4;
    let mine = own + r * PW4;
    let prow = (sg * 16u + r) * RP4 + h * BH4;
    let ob = row_out(n, ic, p.lq, p.dv / 8u);
    var delta4 = vec4<f32>(0.0);
    for (var c = h * (DP / 16u); c < (h + 1u) * (DP / 16u); c++) {
        let x = unpack8(dout8(ob, c));
        let y = unpack8(o8(ob, c));
        delta4 = fma(x[0], y[0], fma(x[1], y[1], delta4));
    }
    let delta = hsum(delta4) + subgroupShuffleXor(hsum(delta4), 1u);
    let lse = stats[n * p.lq + ic];
    if i < p.lq && h == 0u {
        stats[p.n * p.lq + n * p.lq + i] = delta;
    }
{{ACC_INIT}}
    // The staged q and dO are in the subgroups' operands before the first tile overwrites them.
    workgroupBarrier();
    put_tile(load_kv(n, 0u, li), 0u, li);
    var next = load_kv(n, BT, li);
    workgroupBarrier();
    for (var j0 = 0u; j0 < key_end(row0); j0 += BT) {
        let kvb = ((j0 / BT) % 2u) * KVB;
{{SCORES}}
        workgroupBarrier();
        put_tile(next, (j0 / BT + 1u) % 2u, li);
        next = load_kv(n, j0 + 2u * BT, li);
        // A tile wholly visible to the row, with no mask or dropout, skips the per-score checks.
        let clear = (p.flags & 6u) == 0u && j0 + BT <= p.lk && i < p.lq && lse > DEAD
            && ((p.flags & 1u) == 0u || j0 + BT <= i + 1u);
        for (var c = 0u; c < BH4; c++) {
            let s4 = res[mine + h * BH4 + c];
            let dp4 = res2[mine + h * BH4 + c];
            var ds = vec4<f32>(0.0);
            if clear {
                ds = exp(s4 * p.scale - vec4<f32>(lse)) * (dp4 - vec4<f32>(delta));
            } else {
                for (var e = 0u; e < 4u; e++) {
                    let j = j0 + h * BH + c * 4u + e;
                    if visible(i, j) && lse > DEAD {
                        let pr = exp(s4[e] * p.scale + mask_at(n, i, j) - lse);
                        ds[e] = pr * (dp4[e] * keep(n, i, j) - delta);
                    }
                }
            }
            ps[prow + c] = vec4<f16>(ds);
        }
        workgroupBarrier();
{{ACCUMULATE}}
    }
{{EPILOGUE}}
}
