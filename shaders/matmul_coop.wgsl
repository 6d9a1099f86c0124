// f16 matmul on tensor cores through wgpu's cooperative matrices, f32 accumulation into an f32
// output (cast to f16 afterwards). A workgroup of four subgroups computes a 128x128 tile; each
// subgroup a 64x64 block as 4x4 16x16 tiles, loading A and B straight from memory (row-major,
// leading dimensions lda/ldb). Used only when M and N are multiples of 128 and K of 16, so every
// subgroup's block is in range (naga wants workgroup-uniform control flow around coop ops).
// naga 30: store addresses and strides must be `let`s, or its SPIR-V writer panics on an
// expression it never emitted (spec/wgpu-notes.md, section 2).
enable f16;
enable wgpu_cooperative_matrix;

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    off_a: u32,
    sab: u32,
    lda: u32,
    off_b: u32,
    sbb: u32,
    ldb: u32,
    pad0: u32,
    pad1: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> a: array<f16>;
@group(0) @binding(1) var<storage, read_write> b: array<f16>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_id) sg: u32) {
    let bt = wg.z;
    let lda = p.lda;
    let ldb = p.ldb;
    let ldc = p.n;
    let row0 = wg.y * 128u + (sg / 2u) * 64u;
    let col0 = wg.x * 128u + (sg % 2u) * 64u;
    let a_base = p.off_a + bt * p.sab + row0 * p.lda;
    let b_base = p.off_b + bt * p.sbb + col0;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();
    var c20 = coop_mat16x16<f32, C>();
    var c21 = coop_mat16x16<f32, C>();
    var c22 = coop_mat16x16<f32, C>();
    var c23 = coop_mat16x16<f32, C>();
    var c30 = coop_mat16x16<f32, C>();
    var c31 = coop_mat16x16<f32, C>();
    var c32 = coop_mat16x16<f32, C>();
    var c33 = coop_mat16x16<f32, C>();
    for (var k = 0u; k < p.k; k += 16u) {
        let ia0 = a_base + k + 0u * lda;
        let a0 = coopLoadT<coop_mat16x16<f16, A>>(&a[ia0], lda);
        let ia1 = a_base + k + 16u * lda;
        let a1 = coopLoadT<coop_mat16x16<f16, A>>(&a[ia1], lda);
        let ia2 = a_base + k + 32u * lda;
        let a2 = coopLoadT<coop_mat16x16<f16, A>>(&a[ia2], lda);
        let ia3 = a_base + k + 48u * lda;
        let a3 = coopLoadT<coop_mat16x16<f16, A>>(&a[ia3], lda);
        let ib0 = b_base + k * ldb + 0u;
        let b0 = coopLoadT<coop_mat16x16<f16, B>>(&b[ib0], ldb);
        let ib1 = b_base + k * ldb + 16u;
        let b1 = coopLoadT<coop_mat16x16<f16, B>>(&b[ib1], ldb);
        let ib2 = b_base + k * ldb + 32u;
        let b2 = coopLoadT<coop_mat16x16<f16, B>>(&b[ib2], ldb);
        let ib3 = b_base + k * ldb + 48u;
        let b3 = coopLoadT<coop_mat16x16<f16, B>>(&b[ib3], ldb);
        c00 = coopMultiplyAdd(a0, b0, c00);
        c01 = coopMultiplyAdd(a0, b1, c01);
        c02 = coopMultiplyAdd(a0, b2, c02);
        c03 = coopMultiplyAdd(a0, b3, c03);
        c10 = coopMultiplyAdd(a1, b0, c10);
        c11 = coopMultiplyAdd(a1, b1, c11);
        c12 = coopMultiplyAdd(a1, b2, c12);
        c13 = coopMultiplyAdd(a1, b3, c13);
        c20 = coopMultiplyAdd(a2, b0, c20);
        c21 = coopMultiplyAdd(a2, b1, c21);
        c22 = coopMultiplyAdd(a2, b2, c22);
        c23 = coopMultiplyAdd(a2, b3, c23);
        c30 = coopMultiplyAdd(a3, b0, c30);
        c31 = coopMultiplyAdd(a3, b1, c31);
        c32 = coopMultiplyAdd(a3, b2, c32);
        c33 = coopMultiplyAdd(a3, b3, c33);
    }
    let o = (bt * p.m + row0) * p.n + col0;
    let o00 = o + 0u * ldc + 0u;
    coopStoreT(c00, &c[o00], ldc);
    let o01 = o + 0u * ldc + 16u;
    coopStoreT(c01, &c[o01], ldc);
    let o02 = o + 0u * ldc + 32u;
    coopStoreT(c02, &c[o02], ldc);
    let o03 = o + 0u * ldc + 48u;
    coopStoreT(c03, &c[o03], ldc);
    let o10 = o + 16u * ldc + 0u;
    coopStoreT(c10, &c[o10], ldc);
    let o11 = o + 16u * ldc + 16u;
    coopStoreT(c11, &c[o11], ldc);
    let o12 = o + 16u * ldc + 32u;
    coopStoreT(c12, &c[o12], ldc);
    let o13 = o + 16u * ldc + 48u;
    coopStoreT(c13, &c[o13], ldc);
    let o20 = o + 32u * ldc + 0u;
    coopStoreT(c20, &c[o20], ldc);
    let o21 = o + 32u * ldc + 16u;
    coopStoreT(c21, &c[o21], ldc);
    let o22 = o + 32u * ldc + 32u;
    coopStoreT(c22, &c[o22], ldc);
    let o23 = o + 32u * ldc + 48u;
    coopStoreT(c23, &c[o23], ldc);
    let o30 = o + 48u * ldc + 0u;
    coopStoreT(c30, &c[o30], ldc);
    let o31 = o + 48u * ldc + 16u;
    coopStoreT(c31, &c[o31], ldc);
    let o32 = o + 48u * ldc + 32u;
    coopStoreT(c32, &c[o32], ldc);
    let o33 = o + 48u * ldc + 48u;
    coopStoreT(c33, &c[o33], ldc);
}
