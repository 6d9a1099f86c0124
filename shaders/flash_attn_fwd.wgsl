// Flash attention's forward pass (FlashAttention-2's loop, one query row per S invocations):
// a workgroup takes 64 query rows of one (b, h), stages BT keys and values at a time in
// workgroup memory and keeps, per row, the running max, the running sum and the unnormalised
// output in registers, rescaled once per tile. Only the output and one log-sum-exp per row
// are written; no score matrix exists. Under causality the key tiles past the workgroup's last
// query are never loaded. A row whose every key is masked gives zeros (PyTorch's safe softmax)
// and a log-sum-exp of MASKED.
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> q: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> k: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> v: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> mask: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<{{T}}>;
// The log-sum-exp of row (n, i) at n * lq + i (the backward's deltas follow it).
@group(0) @binding(5) var<storage, read_write> stats: array<f32>;

{{KV_TILES}}

@compute @workgroup_size({{NI}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = head_of(wid);
    let row0 = block_row(wid, p.lq, true);
    let i = row0 + li / S;
    let part = li % S;
    var qr: array<vec4<f32>, DS>;
    var acc: array<vec4<f32>, DS>;
    for (var c = 0u; c < DS; c++) {
        qr[c] = q4(n, i, c * S + part) * p.scale;
        acc[c] = vec4<f32>(0.0);
    }
    var m = MASKED;
    var l = 0.0;
    for (var j0 = 0u; j0 < key_end(row0); j0 += BT) {
        stage_kv(n, j0, li);
        var s: array<f32, BT>;
        var tile_max = MASKED;
        for (var r = 0u; r < BT; r++) {
            let j = j0 + r;
            var x4 = vec4<f32>(0.0);
            for (var c = 0u; c < DS; c++) {
                x4 = fma(qr[c], kt[r * DP4 + c * S + part], x4);
            }
            var x = max(across(hsum(x4)) + mask_at(n, i, j), MASKED);
            if !visible(i, j) {
                x = MASKED;
            }
            s[r] = x;
            tile_max = max(tile_max, x);
        }
        let m_new = max(m, tile_max);
        if m_new > DEAD {
            let alpha = exp(m - m_new);
            l *= alpha;
            for (var c = 0u; c < DS; c++) {
                acc[c] *= alpha;
            }
            for (var r = 0u; r < BT; r++) {
                let pr = exp(s[r] - m_new);
                l += pr;
                let pd = pr * keep(n, i, j0 + r);
                if pd != 0.0 {
                    for (var c = 0u; c < DS; c++) {
                        acc[c] = fma(vec4<f32>(pd), vt[r * DP4 + c * S + part], acc[c]);
                    }
                }
            }
            m = m_new;
        }
    }
    if i < p.lq {
        let inv = select(0.0, 1.0 / l, l > 0.0 && m > DEAD);
        let ob = row_out(n, i, p.lq, p.dv);
        for (var c = 0u; c < DS; c++) {
            let val = acc[c] * inv;
            let c4 = (c * S + part) * 4u;
            for (var e = 0u; e < 4u; e++) {
                if c4 + e < p.dv {
                    o[ob + c4 + e] = {{T}}(val[e]);
                }
            }
        }
        if part == 0u {
            stats[n * p.lq + i] = select(MASKED, m + log(l), l > 0.0 && m > DEAD);
        }
    }
}
