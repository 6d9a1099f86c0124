// What the three cooperative-matrix flash-attention passes (`flash_attn_coop_*.wgsl`) share:
// the staged rows in workgroup memory, each subgroup's f32 patch and f16 probabilities, and
// the staging of q, k and v. A staged row is DP f16 padded by eight (16 bytes), so that the
// rows of a 16 x 16 cooperative load fall in different banks; the layout constants come from
// `kernels/attention_coop.rs`.
//
// The tiles are double-buffered: while the subgroups multiply tile t (in buffer t % 2), the
// lanes' phase between the first two barriers of an iteration stores tile t + 1 into the
// other buffer and issues the loads of tile t + 2. A backward iteration is then
//   products of tile t into the patches | barrier | lanes: patches -> ps, tile t + 1 stored |
//   barrier | products with ps and tile t
// and every buffer is written only after the barrier that follows its last reads (two
// barriers a tile where a single buffer needed four). The forward's P v goes through the
// patch too, so that its iteration adds two barriers (four where one buffer needed five):
// after P v, for the lanes' add into the output, and after that add, before the next scores.
// A staged row, in vec4<f16>s.
const RS4: u32 = {{RS4}}u;
// A row of a subgroup's probabilities (BT keys, padded), in vec4<f16>s.
const RP4: u32 = {{RP4}}u;
// A row of a subgroup's f32 patch, in vec4<f32>s.
const PW4: u32 = {{PW4}}u;
// Keys (or queries) of a tile that one lane takes: half the tile.
const BH: u32 = BT / 2u;
const BH4: u32 = BT / 8u;
// DP / 8: the 16-byte vectors (eight f16) of a staged row, and the vec4<f32>s of the half row
// of results a lane holds.
const DP8: u32 = DP / 8u;

// Two buffers of 2 BT staged rows each: a tile's BT keys then its BT values (or queries then
// output gradients); the first 64 rows first hold the subgroups' fixed operands (BT = 32).
const KVB: u32 = 2u * BT * RS4;
var<workgroup> kv: array<vec4<f16>, 2u * KVB>;
// Each subgroup's 16 rows of f16 probabilities (or score gradients).
var<workgroup> ps: array<vec4<f16>, 64u * RP4>;
// Each subgroup's 16 rows of f32 results leaving the cooperative matrices.
var<workgroup> res: array<vec4<f32>, 64u * PW4>;

// The first key no query of the workgroup from `row0` sees.
fn key_end(row0: u32) -> u32 {
    if (p.flags & 1u) != 0u {
        return min(p.lk, row0 + WG);
    }
    return p.lk;
}

// Eight f16 as a 16-byte vector holds them, into the two vec4<f16>s of `kv` at `at`.
fn put8(at: u32, x: vec4<u32>) {
    kv[at] = vec4<f16>(vec2<f16>(unpack2x16float(x.x)), vec2<f16>(unpack2x16float(x.y)));
    kv[at + 1u] = vec4<f16>(vec2<f16>(unpack2x16float(x.z)), vec2<f16>(unpack2x16float(x.w)));
}

// Eight f32 as f16 in a 16-byte vector.
fn pack8(a: vec4<f32>, b: vec4<f32>) -> vec4<u32> {
    return vec4<u32>(pack2x16float(a.xy), pack2x16float(a.zw), pack2x16float(b.xy),
        pack2x16float(b.zw));
}

// Eight f16 of a 16-byte vector as f32.
fn unpack8(x: vec4<u32>) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(
        vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y)),
        vec4<f32>(unpack2x16float(x.z), unpack2x16float(x.w)));
}

// The first 16-byte vector of (b, h) `n` of an operand at `off` with leading strides sb, sh
// (every address a multiple of eight elements: `ops/attention.rs` sends no other here).
fn base8(off: u32, sb: u32, sh: u32, n: u32) -> u32 {
    return (off + (n / p.heads) * sb + (n % p.heads) * sh) / 8u;
}

// Vector c8 of row i of q (of k, v: row j) from its base `b`, zeros past the rows and the
// head dim.
fn q8(b: u32, i: u32, c8: u32) -> vec4<u32> {
    let x = q[b + min(i, p.lq - 1u) * (p.q_st / 8u) + min(c8, p.d / 8u - 1u)];
    return select(vec4<u32>(0u), x, vec4<bool>(i < p.lq && c8 * 8u < p.d));
}

fn k8(b: u32, j: u32, c8: u32) -> vec4<u32> {
    let x = k[b + min(j, p.lk - 1u) * (p.k_st / 8u) + min(c8, p.d / 8u - 1u)];
    return select(vec4<u32>(0u), x, vec4<bool>(j < p.lk && c8 * 8u < p.d));
}

fn v8(b: u32, j: u32, c8: u32) -> vec4<u32> {
    let x = v[b + min(j, p.lk - 1u) * (p.v_st / 8u) + min(c8, p.dv / 8u - 1u)];
    return select(vec4<u32>(0u), x, vec4<bool>(j < p.lk && c8 * 8u < p.dv));
}

// Queries row0 .. row0 + 64 of (b, h) `n` into `kv`, zeros past lq and the head dim; by the
// whole workgroup.
fn stage_q(n: u32, row0: u32, li: u32) {
    let b = base8(p.q_off, p.q_sb, p.q_sh, n);
    for (var e = li; e < 64u * DP8; e += 128u) {
        put8((e / DP8) * RS4 + (e % DP8) * 2u, q8(b, row0 + e / DP8, e % DP8));
    }
}

// A tile's rows as one invocation loads them: its NPT shares of the first BT rows (keys, or
// queries in the dK/dV pass) and of the next BT (values, or output gradients). The loads of
// the next tile are issued before the current one's products, so that their latency overlaps
// them (staging straight from memory held the forward at 23.6 TFLOP/s against 38 with no
// staging at all, H200).
const NPT: u32 = (BT * DP8 + 127u) / 128u;

struct Tile {
    a: array<vec4<u32>, NPT>,
    b: array<vec4<u32>, NPT>,
}

// Stores a loaded tile into buffer `buf` of `kv`; by the whole workgroup.
fn put_tile(t: Tile, buf: u32, li: u32) {
    let at = buf * KVB;
    for (var s = 0u; s < NPT; s++) {
        let e = li + s * 128u;
        if e < BT * DP8 {
            put8(at + (e / DP8) * RS4 + (e % DP8) * 2u, t.a[s]);
            put8(at + (BT + e / DP8) * RS4 + (e % DP8) * 2u, t.b[s]);
        }
    }
}

// Keys j0 .. j0 + BT of (b, h) `n` and their values (zeros past lk and the head dims).
fn load_kv(n: u32, j0: u32, li: u32) -> Tile {
    let kb = base8(p.k_off, p.k_sb, p.k_sh, n);
    let vb = base8(p.v_off, p.v_sb, p.v_sh, n);
    var t: Tile;
    for (var s = 0u; s < NPT; s++) {
        let e = min(li + s * 128u, BT * DP8 - 1u);
        t.a[s] = k8(kb, j0 + e / DP8, e % DP8);
        t.b[s] = v8(vb, j0 + e / DP8, e % DP8);
    }
    return t;
}
