// The scalar variant's operand access (any strides, any sizes): every index is guarded.
@group(0) @binding(0) var<storage, read_write> a: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> b: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;

// Element e (0..2047) of the 128x16 slice of a at (m0, k0): which (m, k) it is. Consecutive
// e walk a's unit-stride dim.
fn a_coord(e: u32) -> vec2<u32> {
    if p.sak == 1u {
        return vec2<u32>(e / 16u, e % 16u);
    }
    return vec2<u32>(e % 128u, e / 128u);
}

fn b_coord(e: u32) -> vec2<u32> {
    if p.sbn == 1u {
        return vec2<u32>(e / 128u, e % 128u);
    }
    return vec2<u32>(e % 16u, e / 16u);
}

fn load_a(base: u32, m0: u32, k0: u32, e: u32) -> f32 {
    let c = a_coord(e);
    if m0 + c.x < p.m && k0 + c.y < p.k {
        return f32(a[base + (m0 + c.x) * p.sam + (k0 + c.y) * p.sak]);
    }
    return 0.0;
}

fn load_b(base: u32, n0: u32, k0: u32, e: u32) -> f32 {
    let c = b_coord(e);
    if k0 + c.x < p.k && n0 + c.y < p.n {
        return f32(b[base + (k0 + c.x) * p.sbk + (n0 + c.y) * p.sbn]);
    }
    return 0.0;
}

// Columns n..n+3 of row m (`matmul_store_row.wgsl`, put after this file by `Kernel::source`).
fn store4(bt: u32, m: u32, n: u32, v: vec4<f32>) {
    store_row(bt, m, n, v);
}

