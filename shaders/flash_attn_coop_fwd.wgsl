// Flash attention's forward pass on cooperative matrices (tensor cores), f16 storage read and
// written as 16-byte vectors (eight elements; `ops/attention.rs` sends only aligned rows): a
// workgroup of four subgroups takes 64 query rows of one (b, h), each subgroup 16 of them.
// Per tile of BT keys: the tile's keys and values are staged in workgroup memory as f16
// (double-buffered: the next tile is stored while the lanes take the softmax), each
// subgroup multiplies its queries by the keys (S, 16 x BT in f32) and stores S into its own
// patch; its 32 lanes (two per row, each half the tile) take the online softmax there (the
// running max, the rescale alpha, the probabilities rounded to f16 into `ps`, the running sum
// per half row); the subgroup multiplies the probabilities by the values and stores that
// (16 x DP) into the patch, and each lane adds its half row into the output it holds in
// registers, rescaled by alpha. Scores are scaled, masked and dropped in f32 by the lanes,
// with the helpers the SIMT kernels use (`flash_attn_common.wgsl`). Cooperative matrices have
// no per-element access in WGSL, hence the trips through workgroup memory.
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> q: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> k: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> v: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> mask: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> stats: array<f32>;

{{COOP_SHARED}}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32,
        @builtin(local_invocation_index) li: u32) {
    let n = head_of(wid);
    let row0 = block_row(wid, p.lq, true);
    stage_q(n, row0, li);
    workgroupBarrier();
{{LOAD_QA}}
    let r = lane / 2u;
    let h = lane % 2u;
    let i = row0 + sg * 16u + r;
    let own = sg * 16u * PW4;
    let mine = own + r * PW4;
    let prow = (sg * 16u + r) * RP4 + h * BH4;
    var acc: array<vec4<f32>, DP8>;
    var m = MASKED;
    var l = 0.0;
    // The staged q are in the subgroups' operands before the first tile overwrites them.
    workgroupBarrier();
    put_tile(load_kv(n, 0u, li), 0u, li);
    var next = load_kv(n, BT, li);
    workgroupBarrier();
    for (var j0 = 0u; j0 < key_end(row0); j0 += BT) {
        let kvb = ((j0 / BT) % 2u) * KVB;
{{SCORES}}
        workgroupBarrier();
        var x: array<vec4<f32>, BH4>;
        var tmax = MASKED;
        // A tile wholly visible to the row (no mask, inside both lengths, before the diagonal)
        // skips the per-score checks (H200: 25.9 -> 30.3 TFLOP/s).
        let clear = (p.flags & 2u) == 0u && j0 + BT <= p.lk && i < p.lq
            && ((p.flags & 1u) == 0u || j0 + BT <= i + 1u);
        for (var c = 0u; c < BH4; c++) {
            let s4 = res[mine + h * BH4 + c] * p.scale;
            if clear {
                x[c] = s4;
            } else {
                for (var e = 0u; e < 4u; e++) {
                    let j = j0 + h * BH + c * 4u + e;
                    var xv = max(s4[e] + mask_at(n, i, j), MASKED);
                    if !visible(i, j) {
                        xv = MASKED;
                    }
                    x[c][e] = xv;
                }
            }
            tmax = max(tmax, max(max(x[c].x, x[c].y), max(x[c].z, x[c].w)));
        }
        tmax = max(tmax, subgroupShuffleXor(tmax, 1u));
        let m_new = max(m, tmax);
        let live = m_new > DEAD;
        let alpha = select(1.0, exp(m - m_new), live);
        l *= alpha;
        for (var c = 0u; c < BH4; c++) {
            let pr = select(vec4<f32>(0.0), exp(x[c] - vec4<f32>(m_new)), vec4<bool>(live));
            l += hsum(pr);
            var pd = pr;
            if (p.flags & 4u) != 0u {
                for (var e = 0u; e < 4u; e++) {
                    pd[e] *= keep(n, i, j0 + h * BH + c * 4u + e);
                }
            }
            ps[prow + c] = vec4<f16>(pd);
        }
        m = m_new;
        // The next tile into the other buffer (its last reader, the previous tile's P v, is
        // two barriers back), and the loads of the one after it.
        put_tile(next, (j0 / BT + 1u) % 2u, li);
        next = load_kv(n, j0 + 2u * BT, li);
        workgroupBarrier();
{{PV}}
        workgroupBarrier();
        for (var c = 0u; c < DP8; c++) {
            acc[c] = fma(acc[c], vec4<f32>(alpha), res[mine + h * DP8 + c]);
        }
        // (The patch read before the next tile's scores overwrite it.)
        workgroupBarrier();
    }
    l += subgroupShuffleXor(l, 1u);
    if i < p.lq {
        let inv = select(0.0, 1.0 / l, l > 0.0 && m > DEAD);
        let ob = row_out(n, i, p.lq, p.dv / 8u) + h * (DP / 16u);
        for (var t = 0u; t < DP / 16u; t++) {
            if h * (DP / 2u) + t * 8u < p.dv {
                o[ob + t] = pack8(acc[2u * t] * inv, acc[2u * t + 1u] * inv);
            }
        }
        if h == 0u {
            stats[n * p.lq + i] = select(MASKED, m + log(l), l > 0.0 && m > DEAD);
        }
    }
}
