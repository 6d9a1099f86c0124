// What the three flash-attention kernels share (`flash_attn_fwd.wgsl`, `flash_attn_dq.wgsl`,
// `flash_attn_dkdv.wgsl`): the immediates, the operands' addressing, the mask, causality and
// dropout. Rows are `n` = b * heads + h of the flattened leading dims; q, k and v are read
// through their strides (the last dim unit-stride), the outputs and the output's gradient
// through `row_out`. Scores are
// `q . k * scale + mask` in f32 whatever the storage dtype. DP (the head dim rounded up) and
// BT (the rows of a staged tile) are specialisation constants.
{{ENABLES}}
struct Params {
    n: u32,
    heads: u32,
    lq: u32,
    lk: u32,
    d: u32,
    dv: u32,
    q_sb: u32,
    q_sh: u32,
    q_st: u32,
    k_sb: u32,
    k_sh: u32,
    k_st: u32,
    v_sb: u32,
    v_sh: u32,
    v_st: u32,
    q_off: u32,
    k_off: u32,
    v_off: u32,
    m_sb: u32,
    m_sh: u32,
    m_sq: u32,
    m_sk: u32,
    m_off: u32,
    // Bit 0: causal (key j attends query i when j <= i); bit 1: an additive mask; bit 2: dropout;
    // bit 3: the outputs token-major (`row_out`).
    flags: u32,
    scale: f32,
    drop_p: f32,
    seed_lo: u32,
    seed_hi: u32,
    rng_off: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

var<immediate> p: Params;

const DP: u32 = {{DP}}u;
// The head dim in vec4s: rows are held and staged as vec4<f32>, so that one workgroup-memory
// load feeds four multiply-adds (scalar loads held the scalar kernels at 3.5 TFLOP/s on the
// H100, one load per multiply-add).
const DP4: u32 = {{DP}}u / 4u;
const BT: u32 = {{BT}}u;
// Rows (queries; keys in the dK/dV pass) a workgroup takes (`FlashAttnKernel::rows`).
const WG: u32 = {{WG}}u;
// Invocations a row (`kernels/attention.rs`, `FlashAttnKernel::split`): 1, or 2 or 4 adjacent
// invocations of one subgroup, each holding every S-th vector of the row's registers
// (vectors c S + part), their partial dot products added by `across`. Fewer registers a row
// let more rows share an SM.
const S: u32 = {{S}}u;
// Vectors of a row an invocation holds, and invocations a workgroup.
const DS: u32 = DP4 / S;
const NI: u32 = WG * S;
// Hidden scores are set to MASKED, a finite stand-in for -inf (WGSL does not promise IEEE
// infinities); a running max at or below DEAD means no key has been seen. A mask entry of -inf
// (a bool mask's false, or a user's float('-inf')) is recognised by its bits.
const MASKED: f32 = -1e30;
const DEAD: f32 = -5e29;

{{RANDOM_BITS}}

fn row_q(n: u32, i: u32) -> u32 {
    return p.q_off + (n / p.heads) * p.q_sb + (n % p.heads) * p.q_sh + min(i, p.lq - 1u) * p.q_st;
}

fn row_k(n: u32, j: u32) -> u32 {
    return p.k_off + (n / p.heads) * p.k_sb + (n % p.heads) * p.k_sh + min(j, p.lk - 1u) * p.k_st;
}

fn row_v(n: u32, j: u32) -> u32 {
    return p.v_off + (n / p.heads) * p.v_sb + (n % p.heads) * p.v_sh + min(j, p.lk - 1u) * p.v_st;
}

// The first element of row i of one of the [n, len, width] tensors shaped like an output (o and
// its gradient, dq, dk, dv): rows in (n, i) order, or with flag bit 3 in (b, i, h) order, the
// memory of a contiguous [b, len, heads, width] (PyTorch's flash attention lays its output out
// as q is: token-major under q's usual [b, len, heads, d] view, which makes the transpose back
// before the output projection free).
fn row_out(n: u32, i: u32, len: u32, width: u32) -> u32 {
    if (p.flags & 8u) == 0u {
        return (n * len + i) * width;
    }
    return (((n / p.heads) * len + i) * p.heads + n % p.heads) * width;
}

// Whether query i sees key j at all: inside both lengths and, when causal, j <= i.
fn visible(i: u32, j: u32) -> bool {
    return i < p.lq && j < p.lk && ((p.flags & 1u) == 0u || j <= i);
}

fn mask_at(n: u32, i: u32, j: u32) -> f32 {
    if (p.flags & 2u) == 0u {
        return 0.0;
    }
    let at = p.m_off + (n / p.heads) * p.m_sb + (n % p.heads) * p.m_sh
        + min(i, p.lq - 1u) * p.m_sq + min(j, p.lk - 1u) * p.m_sk;
    let m = mask[at];
    if bitcast<u32>(m) == 0xff800000u {
        return MASKED;
    }
    return max(m, MASKED);
}

// Dropout's factor for score (n, i, j): 0 (dropped) or 1 / (1 - p); the uniform number at
// counter rng_off + (n * lq + i) * lk + j, as `Tensor::rand` of [n, lq, lk] would draw it.
fn keep(n: u32, i: u32, j: u32) -> f32 {
    if (p.flags & 4u) == 0u {
        return 1.0;
    }
    if uniform(p.rng_off + (n * p.lq + i) * p.lk + j) < p.drop_p {
        return 0.0;
    }
    return 1.0 / (1.0 - p.drop_p);
}

// The workgroup's (b, h) (`head_of`) and its first row (query, or key in the dK/dV pass) of
// `len` (`block_row`), as the kernel's order has them (`kernels/attention.rs`,
// `FlashAttnKernel::blocks_first`):
// - on GPUs, workgroups are launched heads first (x: the (b, h), y: the 64-row block), and
//   under causality the blocks that see the most tiles run first (`heaviest_last`: the forward
//   and dQ passes, whose last query block sees every key), so that the longest workgroups do
//   not start in the last wave;
// - on CPU adapters the row blocks go along x in order: heads first, llvmpipe's two threads
//   took the heavy blocks together and ran a quarter slower.
{{BLOCK_ORDER}}

fn hsum(v: vec4<f32>) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}

// The sum of `x` over the S invocations of a row; called in uniform control flow.
{{ACROSS}}
