// Flash attention's backward, second pass: the key and value gradients, one key row per S
// invocations (FlashAttention-2's dK/dV loop). A workgroup takes 64 keys of one (b, h) and walks
// the query tiles (scaled queries, output gradients, log-sum-exps and deltas staged in workgroup
// memory; under causality from the first tile that can see its keys):
//   P = exp(s - lse), dV = sum P * keep * dO_i, dS = P * ((dO_i . v) * keep - delta),
//   dK = sum dS * scale * q_i.
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> q: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> k: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> v: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> mask: array<f32>;
@group(0) @binding(4) var<storage, read_write> dout: array<{{T}}>;
@group(0) @binding(5) var<storage, read_write> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> dk: array<{{T}}>;
@group(0) @binding(7) var<storage, read_write> dv: array<{{T}}>;

// Vectors of each operand an invocation stages a trip, every load before the first store
// (`FlashAttnKernel::staged_per_trip`).
const SU: u32 = {{SU}}u;

var<workgroup> qt: array<vec4<f32>, BT * DP4>;
var<workgroup> go: array<vec4<f32>, BT * DP4>;
var<workgroup> lt: array<f32, BT>;
var<workgroup> dt: array<f32, BT>;

// Elements 4 c4 .. 4 c4 + 3 of the output gradient's row i (zeros past lq and dv).
fn dout4(n: u32, i: u32, c4: u32) -> vec4<f32> {
    let a = at4(row_out(n, min(i, p.lq - 1u), p.lq, p.dv), c4, p.dv);
    let x = vec4<f32>(f32(dout[a.x]), f32(dout[a.y]), f32(dout[a.z]), f32(dout[a.w]));
    return select(vec4<f32>(0.0), x, quad(c4, p.dv) & vec4<bool>(i < p.lq));
}

@compute @workgroup_size({{NI}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = head_of(wid);
    let col0 = block_row(wid, p.lk, false);
    let j = col0 + li / S;
    let part = li % S;
    var kr: array<vec4<f32>, DS>;
    var vr: array<vec4<f32>, DS>;
    var dka: array<vec4<f32>, DS>;
    var dva: array<vec4<f32>, DS>;
    for (var c = 0u; c < DS; c++) {
        kr[c] = k4(n, j, c * S + part);
        vr[c] = v4(n, j, c * S + part);
        dka[c] = vec4<f32>(0.0);
        dva[c] = vec4<f32>(0.0);
    }
    var i_start = 0u;
    if (p.flags & 1u) != 0u {
        i_start = col0 / BT * BT;
    }
    for (var i0 = i_start; i0 < p.lq; i0 += BT) {
        workgroupBarrier();
        for (var e = li; e < BT * DP4; e += SU * NI) {
            var qv: array<vec4<f32>, SU>;
            var gv: array<vec4<f32>, SU>;
            for (var u = 0u; u < SU; u++) {
                let eu = e + u * NI;
                let i = i0 + eu / DP4;
                qv[u] = select(vec4<f32>(0.0), q4(n, i, eu % DP4) * p.scale, vec4<bool>(i < p.lq));
                gv[u] = dout4(n, i, eu % DP4);
            }
            for (var u = 0u; u < SU; u++) {
                let eu = e + u * NI;
                if eu < BT * DP4 {
                    qt[eu] = qv[u];
                    go[eu] = gv[u];
                }
            }
        }
        for (var r = li; r < BT; r += NI) {
            let ic = min(i0 + r, p.lq - 1u);
            lt[r] = select(MASKED, stats[n * p.lq + ic], i0 + r < p.lq);
            dt[r] = stats[p.n * p.lq + n * p.lq + ic];
        }
        workgroupBarrier();
        for (var r = 0u; r < BT; r++) {
            let i = i0 + r;
            if S == 1u {
                // One invocation a row, as in the dQ pass.
                if visible(i, j) && lt[r] > DEAD {
                    var x4 = vec4<f32>(0.0);
                    var dp4 = vec4<f32>(0.0);
                    for (var c = 0u; c < DS; c++) {
                        x4 = fma(qt[r * DP4 + c], kr[c], x4);
                        dp4 = fma(go[r * DP4 + c], vr[c], dp4);
                    }
                    let pr = exp(hsum(x4) + mask_at(n, i, j) - lt[r]);
                    let z = keep(n, i, j);
                    let pz = vec4<f32>(pr * z);
                    let ds = vec4<f32>(pr * (hsum(dp4) * z - dt[r]));
                    for (var c = 0u; c < DS; c++) {
                        dva[c] = fma(pz, go[r * DP4 + c], dva[c]);
                        dka[c] = fma(ds, qt[r * DP4 + c], dka[c]);
                    }
                }
            } else {
                // Split rows, as in the dQ pass.
                var x4 = vec4<f32>(0.0);
                var dp4 = vec4<f32>(0.0);
                for (var c = 0u; c < DS; c++) {
                    x4 = fma(qt[r * DP4 + c * S + part], kr[c], x4);
                    dp4 = fma(go[r * DP4 + c * S + part], vr[c], dp4);
                }
                let x = across(hsum(x4));
                let dp = across(hsum(dp4));
                if visible(i, j) && lt[r] > DEAD {
                    let pr = exp(x + mask_at(n, i, j) - lt[r]);
                    let z = keep(n, i, j);
                    let pz = vec4<f32>(pr * z);
                    let ds = vec4<f32>(pr * (dp * z - dt[r]));
                    for (var c = 0u; c < DS; c++) {
                        dva[c] = fma(pz, go[r * DP4 + c * S + part], dva[c]);
                        dka[c] = fma(ds, qt[r * DP4 + c * S + part], dka[c]);
                    }
                }
            }
        }
    }
    if j < p.lk {
        // The rows' offsets outside the loops: computed inside them (a branch on the layout
        // flag each), they kept the loops from unrolling, dka and dva went to local memory,
        // and the pass took twice as long on the H200 (f32 GPT-2: 80 -> 156 ms in 24 calls).
        let kb = row_out(n, j, p.lk, p.d);
        let vb = row_out(n, j, p.lk, p.dv);
        for (var c = 0u; c < DS; c++) {
            for (var e = 0u; e < 4u; e++) {
                let d = (c * S + part) * 4u + e;
                if d < p.d {
                    dk[kb + d] = {{T}}(dka[c][e]);
                }
                if d < p.dv {
                    dv[vb + d] = {{T}}(dva[c][e]);
                }
            }
        }
    }
}
