
// `rows_words`: `rows_tree` for contiguous rows of 2- or 4-byte elements that are not whole
// vec4s (GPT-2's 50257 logits), as `softmax_words.wgsl` reads them: the row's whole 16-byte
// chunks (CHUNK elements) as vec4<u32> through second bindings of the three buffers, UNROLL
// chunks an invocation in flight, and the fewer than CHUNK elements at either end of the row
// one at a time. Offsets are whole chunks (`ops/softmax.rs` sends no other rows here).
@group(0) @binding(3) var<storage, read_write> yw: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> gw: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> ow: array<vec4<u32>>;

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

// A chunk's terms of the row's sum from its g and y words (y unread by log_softmax's).
fn chunk_terms(gw4: vec4<u32>, yw4: vec4<u32>) -> f32 {
    let g = chunk_of(gw4);
    let y = chunk_of(yw4);
    var s = 0.0;
    for (var k = 0u; k < CV; k++) {
        s += select(dot(g[k], y[k]), dot(g[k], vec4<f32>(1.0)), p.log != 0u);
    }
    return s;
}

// A chunk's gradient from its g and y words and the row's sum (as `grad_at`).
fn chunk_grad(gw4: vec4<u32>, yw4: vec4<u32>, s: f32) -> vec4<u32> {
    let g = chunk_of(gw4);
    let y = chunk_of(yw4);
    var o: array<vec4<f32>, CV>;
    for (var k = 0u; k < CV; k++) {
        if p.log != 0u {
            o[k] = g[k] - exp(y[k]) * s;
        } else {
            o[k] = y[k] * (g[k] - vec4<f32>(s));
        }
    }
    return word_of(o);
}

@compute @workgroup_size(256)
fn rows_words(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let r = wid.x + wid.y * nw.x;
    if r >= p.rows {
        return;
    }
    let base = r * p.inner;
    let end = base + p.inner;
    // The whole chunks [c0, c1) and the elements before ([base, base + head)) and after
    // ([tail, end)) them, as `softmax_words.wgsl` splits a row.
    let c0 = (base + CHUNK - 1u) / CHUNK;
    let c1 = end / CHUNK;
    let head = min(c0 * CHUNK, end) - base;
    let tail = max(c1 * CHUNK, base + head);
    let yc = p.y_off / CHUNK;
    let gc = p.g_off / CHUNK;
    let oc = p.out_off / CHUNK;
    var s = 0.0;
    if t < head {
        s += term_at(base + t);
    }
    if t < end - tail {
        s += term_at(tail + t);
    }
    var c = c0 + t;
    // log_softmax's sum reads g alone: y's words are loaded only for softmax's.
    let ys = select(1u, 0u, p.log != 0u);
    for (; c + (UNROLL - 1u) * 256u < c1; c += UNROLL * 256u) {
        var g: array<vec4<u32>, UNROLL>;
        var y: array<vec4<u32>, UNROLL>;
        for (var u = 0u; u < UNROLL; u++) {
            g[u] = gw[gc + c + u * 256u];
            if ys != 0u {
                y[u] = yw[yc + c + u * 256u];
            }
        }
        for (var u = 0u; u < UNROLL; u++) {
            s += chunk_terms(g[u], y[u]);
        }
    }
    for (; c < c1; c += 256u) {
        var y = vec4<u32>(0u);
        if ys != 0u {
            y = yw[yc + c];
        }
        s += chunk_terms(gw[gc + c], y);
    }
    let total = row_sum(t, s);
    if t < head {
        store(p.out_off + base + t, grad_at(base + t, total));
    }
    if t < end - tail {
        store(p.out_off + tail + t, grad_at(tail + t, total));
    }
    c = c0 + t;
    for (; c + (UNROLL - 1u) * 256u < c1; c += UNROLL * 256u) {
        var g: array<vec4<u32>, UNROLL>;
        var y: array<vec4<u32>, UNROLL>;
        for (var u = 0u; u < UNROLL; u++) {
            g[u] = gw[gc + c + u * 256u];
            y[u] = yw[yc + c + u * 256u];
        }
        for (var u = 0u; u < UNROLL; u++) {
            ow[oc + c + u * 256u] = chunk_grad(g[u], y[u], total);
        }
    }
    for (; c < c1; c += 256u) {
        ow[oc + c] = chunk_grad(gw[gc + c], yw[yc + c], total);
    }
}
