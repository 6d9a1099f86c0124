// Contiguous rows of 2- or 4-byte elements that are not whole vec4s (GPT-2's 50257 logits), a
// workgroup of 256 per row as in `softmax_tree.wgsl`: the row's whole 16-byte chunks (CHUNK
// elements) are read and written as vec4<u32> through second bindings of the same two
// buffers, UNROLL chunks an invocation in flight, and the fewer than CHUNK elements at either
// end of the row, whose chunks it shares with its neighbours, one at a time (`load`,
// `store`). Offsets are whole chunks (`ops/softmax.rs` sends no other rows here), so a row's
// chunks are the same in x and out. The strided kernel, one element an invocation at a time,
// took an f16 [8192, 50257] 2.8 ms on the H200 (about 600 GB/s).
{{MERGE}}

@group(0) @binding(2) var<storage, read_write> xw: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> ow: array<vec4<u32>>;

const CHUNK: u32 = {{CHUNK}}u;
// The vec4<f32>s of a chunk.
const CV: u32 = CHUNK / 4u;
const UNROLL: u32 = {{UNROLL}}u;

// A chunk's elements as f32, and back.
fn chunk_of(w: vec4<u32>) -> array<vec4<f32>, CV> {
    {{GET}}
}

fn word_of(v: array<vec4<f32>, CV>) -> vec4<u32> {
    {{PUT}}
}

// Chunk c of x (counted as the row's elements are, from x's offset), and of out.
fn get_chunk(c: u32) -> array<vec4<f32>, CV> {
    return chunk_of(xw[p.off / CHUNK + c]);
}

fn put_chunk(c: u32, v: array<vec4<f32>, CV>) {
    ow[c] = word_of(v);
}

// The running (max, sum) after UNROLL chunks: one rescale for all of them.
fn accumulate_chunks(m: ptr<function, f32>, s: ptr<function, f32>, v: array<vec4<f32>, UNROLL * CV>) {
    var mx = v[0];
    for (var i = 1u; i < UNROLL * CV; i++) {
        mx = max(mx, v[i]);
    }
    let nm = max(*m, max(max(mx.x, mx.y), max(mx.z, mx.w)));
    if bitcast<u32>(nm) != 0xff800000u {
        var e = vec4<f32>(0.0);
        for (var i = 0u; i < UNROLL * CV; i++) {
            e += exp(v[i] - vec4<f32>(nm));
        }
        *s = rescale(*s, *m, nm) + dot(e, vec4<f32>(1.0));
        *m = nm;
    }
}

// An output unit from its input, the row's max and its sum (as `write_row`).
fn finish(x: vec4<f32>, mx: f32, log_sum: f32, sum: f32) -> vec4<f32> {
    let v = x - vec4<f32>(mx);
    if p.log == 1u {
        return v - vec4<f32>(log_sum);
    }
    return exp(v) / sum;
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let row = wid.x + wid.y * nw.x;
    if row >= p.rows {
        return;
    }
    let base = row * p.units;
    let end = base + p.units;
    // The whole chunks [c0, c1), the head [base, base + head) before them and the tail
    // [tail, end) after them, fewer than CHUNK elements each (a short row is all head).
    let c0 = (base + CHUNK - 1u) / CHUNK;
    let c1 = end / CHUNK;
    let head = min(c0 * CHUNK, end) - base;
    let tail = max(c1 * CHUNK, base + head);
    var m = neg_inf();
    var s = 0.0;
    var bad = 0u;
    if t < head {
        let v = load(base + t);
        bad |= bad_lanes(v);
        accumulate(&m, &s, v);
    }
    if t < end - tail {
        let v = load(tail + t);
        bad |= bad_lanes(v);
        accumulate(&m, &s, v);
    }
    var c = c0 + t;
    for (; c + (UNROLL - 1u) * 256u < c1; c += UNROLL * 256u) {
        var v: array<vec4<f32>, UNROLL * CV>;
        for (var u = 0u; u < UNROLL; u++) {
            let w = get_chunk(c + u * 256u);
            for (var k = 0u; k < CV; k++) {
                v[u * CV + k] = w[k];
                bad |= bad_lanes(w[k]);
            }
        }
        accumulate_chunks(&m, &s, v);
    }
    for (; c < c1; c += 256u) {
        let w = get_chunk(c);
        for (var k = 0u; k < CV; k++) {
            bad |= bad_lanes(w[k]);
            accumulate(&m, &s, w[k]);
        }
    }
    let r = merge_row(t, m, s, bad);
    // A bad row is all NaN, as `write_row` writes it.
    let nan_row = r.bad != 0u || bitcast<u32>(r.m) == 0xff800000u;
    let log_sum = log(r.s);
    if t < head {
        store(base + t, select(finish(load(base + t), r.m, log_sum, r.s), vec4<f32>(nan()), nan_row));
    }
    if t < end - tail {
        store(tail + t, select(finish(load(tail + t), r.m, log_sum, r.s), vec4<f32>(nan()), nan_row));
    }
    c = c0 + t;
    for (; c + (UNROLL - 1u) * 256u < c1; c += UNROLL * 256u) {
        var v: array<array<vec4<f32>, CV>, UNROLL>;
        for (var u = 0u; u < UNROLL; u++) {
            v[u] = get_chunk(c + u * 256u);
        }
        for (var u = 0u; u < UNROLL; u++) {
            var o: array<vec4<f32>, CV>;
            for (var k = 0u; k < CV; k++) {
                o[k] = select(finish(v[u][k], r.m, log_sum, r.s), vec4<f32>(nan()), nan_row);
            }
            put_chunk(c + u * 256u, o);
        }
    }
    for (; c < c1; c += 256u) {
        let w = get_chunk(c);
        var o: array<vec4<f32>, CV>;
        for (var k = 0u; k < CV; k++) {
            o[k] = select(finish(w[k], r.m, log_sum, r.s), vec4<f32>(nan()), nan_row);
        }
        put_chunk(c, o);
    }
}
