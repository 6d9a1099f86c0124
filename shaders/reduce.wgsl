// Row reductions (sum, prod, max, min): output element w of `rows * chunks` reduces elements
// [chunk * chunk_len, ...) of row `w / chunks` (a row is `inner` consecutive elements of x in
// row-major order, x any strided view with the reduced dims last). Accumulates in f32;
// multiplies by `scale` (1/n for mean, else 1). max/min propagate NaN, as in PyTorch.
// With chunks > 1 the outputs are f32 partials that a second launch (chunks = 1) reduces.
// The vec4 form counts `inner`, `off` and `chunk_len` in vec4s. `main` comes from one of
// reduce_{tree,subgroup,serial}.wgsl: how a chunk is split among invocations and merged.
{{ENABLES}}
struct Params {
    rows: u32,
    inner: u32,
    chunks: u32,
    chunk_len: u32,
    rank: u32,
    off: u32,
    scale: f32,
    pad: u32,
    shape: array<vec4<u32>, 2>,
    stride: array<vec4<u32>, 2>,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<{{TI}}>;
@group(0) @binding(1) var<storage, read_write> out: array<{{TO}}>;

fn offset(e: u32) -> u32 {
    {{OFFSET}}
}

// Element (or vec4) e of x, widened to the accumulator type.
fn load(e: u32) -> {{ACC}} {
    return {{LOAD}};
}

// The identity of the op (built at run time: naga refuses infinite constants).
fn identity() -> f32 {
    return {{IDENTITY}};
}

// NaN from the bits (per component for vec4): `x != x` may be folded away.
fn nan1(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn nan4(x: vec4<f32>) -> vec4<bool> {
    return (bitcast<vec4<u32>>(x) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
}

fn combine1(a: f32, b: f32) -> f32 {
    return {{COMBINE1}};
}

fn combine(a: {{ACC}}, b: {{ACC}}) -> {{ACC}} {
    return {{COMBINE}};
}

// The partial over units t, t + step, t + 2 step, ... of chunk w (four independent
// accumulators: four loads in flight). The tree and subgroup forms read a chunk with 256
// invocations (step 256), the interleaved form with 64, the serial form with one (t 0, step 1).
fn partial(w: u32, t: u32, step: u32) -> {{ACC}} {
    let row = w / p.chunks;
    let start = (w % p.chunks) * p.chunk_len;
    let end = min(start + p.chunk_len, p.inner);
    let base = row * p.inner;
    var s0 = {{ACC}}(identity());
    var s1 = s0;
    var s2 = s0;
    var s3 = s0;
    var j = start + t;
    for (; j + 3u * step < end; j += 4u * step) {
        s0 = combine(s0, load(base + j));
        s1 = combine(s1, load(base + j + step));
        s2 = combine(s2, load(base + j + 2u * step));
        s3 = combine(s3, load(base + j + 3u * step));
    }
    for (; j < end; j += step) {
        s0 = combine(s0, load(base + j));
    }
    return combine(combine(s0, s1), combine(s2, s3));
}

{{MAIN}}
