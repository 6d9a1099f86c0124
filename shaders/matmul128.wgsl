// Large batched matmul out[b] = a[b] @ b[b] (f32 accumulation), for m and n of 128 or more:
// each workgroup of 16x16 invocations computes a 128x128 tile through 16-deep slices staged in
// shared memory as vec4s (tile_a[k][m/4], tile_b[k][n/4]), so one invocation's 8x8 outputs (rows
// 4*ty..+3 and 64+4*ty..+3, columns 4*tx..+3 and 64+4*tx..+3) cost four vec4 shared reads per
// k step for 64 FMAs (explicit `fma`, the k loop unrolled). Global loads walk the operand's unit-stride dim with consecutive
// invocations (coalesced for transposed inputs too) and the next slice is loaded into
// registers while the current one is multiplied, then stored into the other shared buffer.
// `main` is generated, unrolled, by `src/kernels/matmul128.rs`; the IO placeholder takes the operand access of
// one variant (`matmul128_io.wgsl`: any strides, every index guarded; `matmul128_vec4.wgsl`: whole
// aligned tiles, in range by the conditions `ops/matmul.rs` checks). Trusted module.
{{ENABLES}}
{{PARAMS}}
// Two buffers (the next slice is stored while the current one is read: one barrier per slice)
// of 16 rows of {{ROW}} vec4s. So that stores of one column by consecutive invocations spread over
// the banks, rows are either padded to 33 vec4s (where the device allows 33 KiB of shared
// memory) or, at 32 KiB (lavapipe's limit), row k keeps vec4 column c at c ^ (k % 8).
// tile_a's rows are as long as tile_b's, except in the convolution's 64x256 tile (17 vec4s).
var<workgroup> tile_a: array<vec4<f32>, {{TILE_A}}>;
var<workgroup> tile_b: array<vec4<f32>, {{TILE}}>;

{{IO}}
{{MAIN}}