// Counter-based random numbers: element e of a draw is a pure function of (seed, offset + e),
// computed with 32-bit integer hashing only, so uniform numbers are bit-identical on every
// adapter and on the CPU reference (src/cpu/random.rs). Normal numbers use Box-Muller on two
// uniforms (counters offset + 2e and offset + 2e + 1: a normal draw of n advances the offset
// by 2n, so no two draws share a counter); log/cos may differ in the last bits between adapters.
{{ENABLES}}
struct Params {
    numel: u32,
    seed_lo: u32,
    seed_hi: u32,
    offset: u32,
    normal: u32,
    a: f32,
    b: f32,
    pad: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;

{{RANDOM_BITS}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let e = gid.x + gid.y * nw.x * 256u;
    if e >= p.numel {
        return;
    }
    var v: f32;
    if p.normal == 1u {
        let c = p.offset + 2u * e;
        let u1 = 1.0 - uniform(c);
        let u2 = uniform(c + 1u);
        v = p.a + p.b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    } else {
        v = p.a + (p.b - p.a) * uniform(p.offset + e);
    }
    out[e] = {{T}}(v);
}
