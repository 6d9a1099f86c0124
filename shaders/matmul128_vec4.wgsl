// The vec4 variant's operand access (f32, whole tiles: m a multiple of 128, n of 4, k of 16;
// offsets and the strides that are not 1 multiples of 4; a contiguous output): every global
// access is a 16-byte vector along the operand's unit-stride dim, guarded only past n. An operand
// whose unit-stride dim is the tile's shared-memory row (a's m, b's n) is stored as one vec4;
// the other layout scatters its four k values into four rows. The placeholders A_ROWS (A's
// unit-stride dim is k, `sak == 1`) and B_ROWS (B's is n, `sbn == 1`) become the tests on the
// strides, or constants where `Vec4Layout` compiles a layout in.
@group(0) @binding(0) var<storage, read_write> a: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> b: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> bias: array<vec4<f32>>;

// Which row of k (0..15) and which vector of it (0..31) vector v of an operand read along m or
// n (A column-major, B row-major) holds. In the kernels that test the layout at run time
// (`LINES8_RUNTIME` in `src/kernels/matmul128.rs`): eight rows of four vectors, 64 bytes each,
// a subgroup; in the others one row of 32, 512 contiguous bytes a subgroup.
fn rowmap(v: u32) -> vec2<u32> {
    if {{LINES8}} {
        let w = v / 32u;
        let l = v % 32u;
        return vec2<u32>(8u * (w % 2u) + l / 4u, 4u * (w / 2u) + l % 4u);
    }
    return vec2<u32>(v / 32u, v % 32u);
}

// Vector v (0..511) of the 128x16 slice of a at (m0, k0), in elements divided by 4.
fn load_a4(base: u32, m0: u32, k0: u32, v: u32) -> vec4<f32> {
    if {{A_ROWS}} {
        return a[(base + (m0 + v / 4u) * p.sam + k0) / 4u + v % 4u];
    }
    let q = rowmap(v);
    return a[(base + (k0 + q.x) * p.sak + m0) / 4u + q.y];
}

// N need only be a multiple of 4: B's vectors and the stores past it are skipped (the MLP's
// `g^T @ x` with N = 784 runs here whole).
fn load_b4(base: u32, n0: u32, k0: u32, v: u32) -> vec4<f32> {
    if {{B_ROWS}} {
        let q = rowmap(v);
        if n0 + 4u * q.y >= p.n {
            return vec4<f32>();
        }
        return b[(base + (k0 + q.x) * p.sbk + n0) / 4u + q.y];
    }
    if n0 + v / 4u >= p.n {
        return vec4<f32>();
    }
    return b[(base + (n0 + v / 4u) * p.sbn + k0) / 4u + v % 4u];
}

// Element (row k, column c) of a shared tile of rows of vec4s, at buffer `buf`.
fn tile_at(buf: u32, k: u32, c: u32) -> u32 {
    return buf + k * {{ROW}}u + ((c / 4u) ^ ((k % 8u) * {{SWZ}}u));
}

fn store_a4(buf: u32, v: u32, x: vec4<f32>) {
    if {{A_ROWS}} {
        let m = v / 4u;
        let k = 4u * (v % 4u);
        for (var j = 0u; j < 4u; j++) {
            tile_a[tile_at(buf, k + j, m)][m % 4u] = x[j];
        }
    } else {
        let q = rowmap(v);
        tile_a[tile_at(buf, q.x, 4u * q.y)] = x;
    }
}

fn store_b4(buf: u32, v: u32, x: vec4<f32>) {
    if {{B_ROWS}} {
        let q = rowmap(v);
        tile_b[tile_at(buf, q.x, 4u * q.y)] = x;
    } else {
        let n = v / 4u;
        let k = 4u * (v % 4u);
        for (var j = 0u; j < 4u; j++) {
            tile_b[tile_at(buf, k + j, n)][n % 4u] = x[j];
        }
    }
}

// Columns n..n+3 of row m, plus the bias where asked; the epilogue then clamps them at zero in
// `Vec4Layout::RuntimeRelu` (`ops::linear_relu`; NaN stays NaN, as in `relu`), or keeps them
// where the mask in the fourth binding is not <= 0 in the `*Mask` layouts (ReLU's backward,
// PyTorch's threshold_backward: zero where the saved output is <= 0, even for a NaN product;
// a NaN output passes the gradient).
fn store4(bt: u32, m: u32, n: u32, v: vec4<f32>) {
    if n >= p.n {
        return;
    }
    var x = v;
    if (p.flags & 1u) != 0u {
        x += bias[(p.off_bias + n) / 4u];
    }
    {{EPILOGUE}}
    out[((bt * p.m + m) * p.n + n) / 4u] = x;
}
