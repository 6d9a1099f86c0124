// The SIMT passes' row reads (`flash_attn_fwd.wgsl`, `_dq`, `_dkdv`): q, k and v element by
// element, any alignment.
// Which of elements 4 c4 .. 4 c4 + 3 lie below `len`.
fn quad(c4: u32, len: u32) -> vec4<bool> {
    let c = c4 * 4u;
    return vec4<bool>(c < len, c + 1u < len, c + 2u < len, c + 3u < len);
}

// The indices of elements 4 c4 .. 4 c4 + 3 of a row at `b` with `len` elements, clamped into
// the row (the loads past it are discarded by `quad`).
fn at4(b: u32, c4: u32, len: u32) -> vec4<u32> {
    return b + min(vec4<u32>(c4 * 4u) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(len - 1u));
}

// Elements 4 c4 .. 4 c4 + 3 of row `i` of q (of k, v: row `j`), zeros past the head dim.
fn q4(n: u32, i: u32, c4: u32) -> vec4<f32> {
    let a = at4(row_q(n, i), c4, p.d);
    let x = vec4<f32>(f32(q[a.x]), f32(q[a.y]), f32(q[a.z]), f32(q[a.w]));
    return select(vec4<f32>(0.0), x, quad(c4, p.d));
}

fn k4(n: u32, j: u32, c4: u32) -> vec4<f32> {
    let a = at4(row_k(n, j), c4, p.d);
    let x = vec4<f32>(f32(k[a.x]), f32(k[a.y]), f32(k[a.z]), f32(k[a.w]));
    return select(vec4<f32>(0.0), x, quad(c4, p.d) & vec4<bool>(j < p.lk));
}

fn v4(n: u32, j: u32, c4: u32) -> vec4<f32> {
    let a = at4(row_v(n, j), c4, p.dv);
    let x = vec4<f32>(f32(v[a.x]), f32(v[a.y]), f32(v[a.z]), f32(v[a.w]));
    return select(vec4<f32>(0.0), x, quad(c4, p.dv) & vec4<bool>(j < p.lk));
}
