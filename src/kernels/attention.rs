//! The flash-attention kernels (`shaders/flash_attn_*.wgsl`): the forward pass and the two
//! backward passes, specialised per storage dtype and head-dim class. A class is the head dim
//! rounded up to 16, 32, 64 or 128 (`DP`): the per-row registers and the staged tiles are that
//! wide. The staged tiles are 32 rows deep by default (16 for the widest heads), so that the
//! two take at most 16 KiB of workgroup memory (lavapipe has 32 KiB); GPUs take 8 or 16 rows
//! (`ops/attention.rs`'s `TILE_DEFAULT`).

use crate::base::DType;

/// Which of the three passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlashPass {
    /// The output and one log-sum-exp per query row.
    Forward,
    /// The query gradient, and each row's `delta = dO . O` for the next pass.
    BackwardDq,
    /// The key and value gradients.
    BackwardDkDv,
}

/// One flash-attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashAttnKernel {
    /// The pass.
    pub pass: FlashPass,
    /// The storage dtype of q, k, v and the outputs (f32 or f16; f32 arithmetic).
    pub dtype: DType,
    /// The head-dim class: 16, 32, 64 or 128.
    pub dp: u32,
    /// On cooperative matrices (`attention_coop.rs`): f16 only, head-dim classes up to 64.
    pub coop: bool,
    /// Row blocks launched along x in order (CPU adapters) rather than heads first with the
    /// heaviest blocks first (`flash_attn_common.wgsl`'s `block_row`).
    pub blocks_first: bool,
    /// Invocations a row in the SIMT passes: 1, or 2 or 4 adjacent invocations of one
    /// subgroup (adapters with subgroups), each holding every `split`-th vector of the row
    /// (`flash_attn_common.wgsl`'s `S`).
    pub split: u32,
    /// Rows (queries, or keys in the dK/dV pass) a workgroup takes: 64, or 128 in the SIMT
    /// passes (`flash_attn_common.wgsl`'s `WG`).
    pub rows: u32,
    /// Rows of a staged tile in the SIMT passes (`BT`): `default_tile` (32, or 16 for the
    /// widest heads), or 8 or 16 (`with_tile`).
    pub tile: u32,
}

/// Rows of a staged tile unless `with_tile` says otherwise: 32, or 16 for the widest heads, so
/// that the two staged tiles take at most 16 KiB (lavapipe has 32 KiB of workgroup memory, and
/// llvmpipe's compile time grows with the tile: 128 rows took minutes cold).
fn default_tile(dp: u32) -> u32 {
    (2048 / dp).min(32)
}

/// `head_of` and `block_row` on GPUs (`flash_attn_common.wgsl`).
const HEADS_FIRST: &str = "fn head_of(wid: vec3<u32>) -> u32 {
    return wid.x;
}

fn block_row(wid: vec3<u32>, len: u32, heaviest_last: bool) -> u32 {
    if heaviest_last && (p.flags & 1u) != 0u {
        return ((len + WG - 1u) / WG - 1u - wid.y) * WG;
    }
    return wid.y * WG;
}";

/// `head_of` and `block_row` on CPU adapters.
const BLOCKS_FIRST: &str = "fn head_of(wid: vec3<u32>) -> u32 {
    return wid.y;
}

fn block_row(wid: vec3<u32>, len: u32, heaviest_last: bool) -> u32 {
    return wid.x * WG;
}";

/// The head-dim classes, smallest first.
pub const FLASH_HEAD_DIMS: [u32; 4] = [16, 32, 64, 128];

/// The widest head-dim class on cooperative matrices: at 128 the forward's workgroup memory
/// (staged rows and a patch as wide as the head) passes the 48 KiB NVIDIA's Vulkan offers.
const COOP_MAX_DP: u32 = 64;

impl FlashAttnKernel {
    /// The SIMT kernel for head dims `d` (queries and keys) and `dv` (values), if one takes
    /// them.
    pub fn for_dims(pass: FlashPass, dtype: DType, d: usize, dv: usize) -> Option<Self> {
        let need = d.max(dv);
        FLASH_HEAD_DIMS
            .into_iter()
            .find(|&dp| need <= dp as usize)
            .map(|dp| FlashAttnKernel {
                pass,
                dtype,
                dp,
                coop: false,
                blocks_first: false,
                split: 1,
                rows: 64,
                tile: default_tile(dp),
            })
    }

    /// The same SIMT kernel with `rows` rows a workgroup (64, or 128 with at most two
    /// invocations a row: 256 a workgroup); `None` where it cannot.
    pub fn with_rows(self, rows: u32) -> Option<Self> {
        (!self.coop && (rows == 64 || (rows == 128 && self.split <= 2)))
            .then_some(FlashAttnKernel { rows, ..self })
    }

    /// The same SIMT kernel with `split` invocations a row (1, 2 or 4; 4 only where the head
    /// dim class holds four vectors); `None` for a cooperative-matrix kernel or another split.
    pub fn with_split(self, split: u32) -> Option<Self> {
        (!self.coop && matches!(split, 1 | 2 | 4) && split <= self.dp / 4)
            .then_some(FlashAttnKernel { split, ..self })
    }

    /// The same SIMT kernel staging `tile` rows at a time: its default, 8 or 16 (tiles of 64
    /// rows ran 30% slower in every pass on the H200: docs/lab/attention.md); `None` where it
    /// cannot.
    pub fn with_tile(self, tile: u32) -> Option<Self> {
        (!self.coop && (tile == default_tile(self.dp) || tile == 8 || tile == 16))
            .then_some(FlashAttnKernel { tile, ..self })
    }

    /// The same kernel with its row blocks along x, in order (for a CPU adapter).
    pub fn blocks_first(self) -> Self {
        FlashAttnKernel {
            blocks_first: true,
            ..self
        }
    }

    /// The same pass on cooperative matrices, where one exists (f16, head-dim classes up to
    /// 64) and its workgroup memory fits `shared_limit` bytes.
    pub fn on_coop(self, shared_limit: u32) -> Option<Self> {
        (self.dtype == DType::F16
            && self.dp <= COOP_MAX_DP
            && super::attention_coop::shared_bytes(self.dp) <= shared_limit)
            .then_some(FlashAttnKernel {
                coop: true,
                split: 1,
                rows: 64,
                tile: default_tile(self.dp),
                ..self
            })
    }

    /// Every variant, for validation.
    pub fn all() -> Vec<FlashAttnKernel> {
        let passes = [
            FlashPass::Forward,
            FlashPass::BackwardDq,
            FlashPass::BackwardDkDv,
        ];
        passes
            .into_iter()
            .flat_map(|pass| {
                [DType::F32, DType::F16].into_iter().flat_map(move |dtype| {
                    FLASH_HEAD_DIMS.map(|dp| FlashAttnKernel {
                        pass,
                        dtype,
                        dp,
                        coop: false,
                        blocks_first: false,
                        split: 1,
                        rows: 64,
                        tile: default_tile(dp),
                    })
                })
            })
            .flat_map(|k| {
                [
                    Some(k),
                    Some(k.blocks_first()),
                    k.on_coop(u32::MAX),
                    k.with_split(2),
                    k.with_split(4),
                    k.with_rows(128),
                    k.with_split(2).and_then(|k| k.with_rows(128)),
                    // The GPUs' defaults (`ops/attention.rs`'s TILE_DEFAULT).
                    k.with_rows(128).and_then(|k| k.with_tile(8)),
                    k.with_split(2).and_then(|k| k.with_tile(16)),
                ]
            })
            .flatten()
            .collect()
    }

    /// Rows of a staged tile (`tile`; the cooperative-matrix passes' own).
    pub fn tile_rows(&self) -> u32 {
        if self.coop {
            return super::attention_coop::COOP_BT;
        }
        self.tile
    }

    /// Vectors of each staged operand an invocation loads a trip (`SU` in
    /// `flash_attn_kv_tiles.wgsl` and `flash_attn_dkdv.wgsl`): four in the forward pass (H200,
    /// B8 H12 T1024 D64 causal f32: 11.7 -> 13.0 TFLOP/s); one in the backward passes with a
    /// row an invocation, whose rows already hold 192 (dQ) and 256 (dK/dV) registers (four a
    /// trip took forward + backward from 7.65 to 6.30 TFLOP/s). Split rows share those
    /// registers, and their backward passes load a whole tile in one trip where four vectors
    /// cover it (H200, split 2: forward + backward 13.39 at one a trip in dQ, 13.76 at four;
    /// 13.76 at one in dK/dV, 13.87 at two, 13.92 at four).
    fn staged_per_trip(&self) -> u32 {
        let one_trip = (self.tile_rows() * self.dp / 4 / (self.rows * self.split)).max(1);
        match (self.pass, self.split) {
            (FlashPass::BackwardDq | FlashPass::BackwardDkDv, 1) => 1,
            (FlashPass::Forward, 1) => 4,
            _ => one_trip.min(4),
        }
    }

    /// The kernel's name, as the profiler and tuner print it.
    pub fn name(&self) -> String {
        let pass = match self.pass {
            FlashPass::Forward => "fwd",
            FlashPass::BackwardDq => "dq",
            FlashPass::BackwardDkDv => "dkdv",
        };
        let coop = if self.coop { "coop_" } else { "" };
        let order = if self.blocks_first { "_blocks" } else { "" };
        let split = match self.split {
            1 => String::new(),
            s => format!("_s{s}"),
        };
        let rows = match self.rows {
            64 => String::new(),
            r => format!("_r{r}"),
        };
        let tile = match self.coop || self.tile == default_tile(self.dp) {
            true => String::new(),
            false => format!("_t{}", self.tile),
        };
        format!(
            "flash_attn_{pass}_{coop}{}_d{}{order}{split}{rows}{tile}",
            self.dtype, self.dp
        )
    }

    /// Storage buffers the kernel binds.
    pub fn bindings(&self) -> u32 {
        match self.pass {
            FlashPass::Forward => 6,
            FlashPass::BackwardDq | FlashPass::BackwardDkDv => 8,
        }
    }

    /// `flash_attn_common.wgsl` with the generator and this kernel's block order.
    pub(super) fn common_source(&self) -> String {
        let order = match self.blocks_first {
            true => BLOCKS_FIRST,
            false => HEADS_FIRST,
        };
        let across = match self.split {
            1 => "fn across(x: f32) -> f32 {\n    return x;\n}",
            2 => "fn across(x: f32) -> f32 {\n    return x + subgroupShuffleXor(x, 1u);\n}",
            _ => {
                "fn across(x: f32) -> f32 {\n    let y = x + subgroupShuffleXor(x, 1u);\n    \
                 return y + subgroupShuffleXor(y, 2u);\n}"
            }
        };
        super::random_source(include_str!("../../shaders/flash_attn_common.wgsl"))
            .replace("{{BLOCK_ORDER}}", order)
            .replace("{{ACROSS}}", across)
            .replace("{{S}}", &self.split.to_string())
            .replace("{{WG}}", &self.rows.to_string())
    }

    /// The kernel's WGSL.
    pub fn source(&self) -> String {
        if self.coop {
            return super::attention_coop::source(self);
        }
        let body = match self.pass {
            FlashPass::Forward => include_str!("../../shaders/flash_attn_fwd.wgsl"),
            FlashPass::BackwardDq => include_str!("../../shaders/flash_attn_dq.wgsl"),
            FlashPass::BackwardDkDv => include_str!("../../shaders/flash_attn_dkdv.wgsl"),
        };
        let common = self.common_source() + include_str!("../../shaders/flash_attn_rows.wgsl");
        let src = body
            .replace("{{COMMON}}", &common)
            .replace(
                "{{KV_TILES}}",
                include_str!("../../shaders/flash_attn_kv_tiles.wgsl"),
            )
            .replace("{{SU}}", &self.staged_per_trip().to_string())
            .replace("{{NI}}", &(self.rows * self.split).to_string())
            .replace("{{DP}}", &self.dp.to_string())
            .replace("{{BT}}", &self.tile_rows().to_string());
        super::per_dtype(&src, self.dtype).into_owned()
    }
}
