// Flash attention's backward, first pass: the query gradient, one query row per S invocations
// (FlashAttention-2's dQ loop). Each row first computes delta = dO . O (written after the
// log-sum-exps, for the second pass), then walks the key tiles as the forward pass did,
// recomputing each probability from the saved log-sum-exp:
//   P = exp(s - lse), dP = (dO . v_j) * keep, dS = P * (dP - delta), dQ = scale * sum dS k_j.
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> q: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> k: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> v: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> mask: array<f32>;
// The forward's output and the output's gradient, contiguous [n, lq, dv].
@group(0) @binding(4) var<storage, read_write> o: array<{{T}}>;
@group(0) @binding(5) var<storage, read_write> dout: array<{{T}}>;
// Log-sum-exps at n * lq + i; this pass writes the deltas at n_all * lq + n * lq + i.
@group(0) @binding(6) var<storage, read_write> stats: array<f32>;
@group(0) @binding(7) var<storage, read_write> dq: array<{{T}}>;

{{KV_TILES}}

// Elements 4 c4 .. 4 c4 + 3 of the rows at `b` of o and of dout (dv elements).
fn o4(b: u32, c4: u32) -> vec4<f32> {
    let a = at4(b, c4, p.dv);
    let x = vec4<f32>(f32(o[a.x]), f32(o[a.y]), f32(o[a.z]), f32(o[a.w]));
    return select(vec4<f32>(0.0), x, quad(c4, p.dv));
}

fn dout4(b: u32, c4: u32) -> vec4<f32> {
    let a = at4(b, c4, p.dv);
    let x = vec4<f32>(f32(dout[a.x]), f32(dout[a.y]), f32(dout[a.z]), f32(dout[a.w]));
    return select(vec4<f32>(0.0), x, quad(c4, p.dv));
}

@compute @workgroup_size({{NI}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = head_of(wid);
    let row0 = block_row(wid, p.lq, true);
    let i = row0 + li / S;
    let part = li % S;
    let ic = min(i, p.lq - 1u);
    var qr: array<vec4<f32>, DS>;
    var dor: array<vec4<f32>, DS>;
    var dqa: array<vec4<f32>, DS>;
    let ob = row_out(n, ic, p.lq, p.dv);
    var delta4 = vec4<f32>(0.0);
    for (var c = 0u; c < DS; c++) {
        qr[c] = q4(n, i, c * S + part) * p.scale;
        dor[c] = dout4(ob, c * S + part);
        delta4 = fma(dor[c], o4(ob, c * S + part), delta4);
        dqa[c] = vec4<f32>(0.0);
    }
    let delta = across(hsum(delta4));
    let lse = stats[n * p.lq + ic];
    if i < p.lq && part == 0u {
        stats[p.n * p.lq + n * p.lq + i] = delta;
    }
    for (var j0 = 0u; j0 < key_end(row0); j0 += BT) {
        stage_kv(n, j0, li);
        for (var r = 0u; r < BT; r++) {
            let j = j0 + r;
            if S == 1u {
                // One invocation a row: the dot products only where the key is seen (the
                // split rows' order below took this pass from 4.8 to 6.1 ms on the H200).
                if visible(i, j) && lse > DEAD {
                    var x4 = vec4<f32>(0.0);
                    var dp4 = vec4<f32>(0.0);
                    for (var c = 0u; c < DS; c++) {
                        x4 = fma(qr[c], kt[r * DP4 + c], x4);
                        dp4 = fma(dor[c], vt[r * DP4 + c], dp4);
                    }
                    let pr = exp(hsum(x4) + mask_at(n, i, j) - lse);
                    let ds = vec4<f32>(pr * (hsum(dp4) * keep(n, i, j) - delta));
                    for (var c = 0u; c < DS; c++) {
                        dqa[c] = fma(ds, kt[r * DP4 + c], dqa[c]);
                    }
                }
            } else {
                // Split rows add their dot products across the row before the test, in
                // uniform control flow.
                var x4 = vec4<f32>(0.0);
                var dp4 = vec4<f32>(0.0);
                for (var c = 0u; c < DS; c++) {
                    x4 = fma(qr[c], kt[r * DP4 + c * S + part], x4);
                    dp4 = fma(dor[c], vt[r * DP4 + c * S + part], dp4);
                }
                let x = across(hsum(x4));
                let dp = across(hsum(dp4));
                if visible(i, j) && lse > DEAD {
                    let pr = exp(x + mask_at(n, i, j) - lse);
                    let ds = vec4<f32>(pr * (dp * keep(n, i, j) - delta));
                    for (var c = 0u; c < DS; c++) {
                        dqa[c] = fma(ds, kt[r * DP4 + c * S + part], dqa[c]);
                    }
                }
            }
        }
    }
    if i < p.lq {
        let gb = row_out(n, i, p.lq, p.d);
        for (var c = 0u; c < DS; c++) {
            let val = dqa[c] * p.scale;
            let c4 = (c * S + part) * 4u;
            for (var e = 0u; e < 4u; e++) {
                if c4 + e < p.d {
                    dq[gb + c4 + e] = {{T}}(val[e]);
                }
            }
        }
    }
}
