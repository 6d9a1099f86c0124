//! The optimizers' kernels: `shaders/optim.wgsl` (one parameter per launch, any float layout)
//! and `shaders/optim_multi.wgsl` (SGD over up to six parameters per launch, its WGSL
//! written out per slot: WGSL cannot index bindings, so each slot gets its own bindings,
//! count, offsets and case of the kernel's switch).

/// The fused optimizer updates (entry points of `shaders/optim.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OptimKernel {
    /// SGD (momentum, dampening, nesterov, weight decay), one element per invocation.
    Sgd,
    /// Adam/AdamW, one element per invocation.
    Adam,
    /// The same updates four elements per invocation (vec4 loads: counts and offsets divisible
    /// by 4), which is what reaches HBM bandwidth.
    Sgd4,
    /// Adam/AdamW over vec4s.
    Adam4,
    /// f32 updates eight elements per invocation as four 64-bit words
    /// (`shaders/optim_words.wgsl`: counts and offsets divisible by 8, adapters with 64-bit
    /// integers), a CPU adapter's kernels.
    SgdWords,
    /// Adam/AdamW over 64-bit words.
    AdamWords,
}

impl OptimKernel {
    /// Every optimizer kernel.
    pub const ALL: [OptimKernel; 6] = [
        OptimKernel::Sgd,
        OptimKernel::Adam,
        OptimKernel::Sgd4,
        OptimKernel::Adam4,
        OptimKernel::SgdWords,
        OptimKernel::AdamWords,
    ];

    pub(crate) fn entry_point(self) -> &'static str {
        match self {
            OptimKernel::Sgd | OptimKernel::Sgd4 | OptimKernel::SgdWords => "sgd",
            OptimKernel::Adam | OptimKernel::Adam4 | OptimKernel::AdamWords => "adam",
        }
    }

    /// Elements per invocation.
    pub(crate) fn width(self) -> usize {
        match self {
            OptimKernel::Sgd | OptimKernel::Adam => 1,
            OptimKernel::Sgd4 | OptimKernel::Adam4 => 4,
            OptimKernel::SgdWords | OptimKernel::AdamWords => 8,
        }
    }

    /// The variant `width` elements wide of the same update.
    pub(crate) fn widened(self, width: usize) -> OptimKernel {
        let sgd = self.entry_point() == "sgd";
        match (width, sgd) {
            (8, true) => OptimKernel::SgdWords,
            (8, false) => OptimKernel::AdamWords,
            (4, true) => OptimKernel::Sgd4,
            (4, false) => OptimKernel::Adam4,
            (_, true) => OptimKernel::Sgd,
            (_, false) => OptimKernel::Adam,
        }
    }

    /// Its WGSL for dtype `d` (f32 only for the word kernels).
    pub(crate) fn source(self, d: crate::base::DType) -> String {
        let math = include_str!("../../shaders/optim_math.wgsl");
        let body = match self.width() {
            8 => include_str!("../../shaders/optim_words.wgsl"),
            _ => include_str!("../../shaders/optim.wgsl"),
        };
        super::float_io(&format!("{math}\n{body}"), d, self.width() > 1).into_owned()
    }
}

/// Parameters per launch of `Kernel::SgdMulti`: three storage buffers each and four immediates
/// (plus five shared). Six (18 buffers, 116 bytes of immediates: Vulkan adapters, lavapipe's 32
/// buffers and 128 bytes among them) take a Linear-ReLU-Linear-ReLU-Linear MLP's weights and
/// biases in one launch; five (15 buffers: GL's llvmpipe allows 16) where six do not fit.
pub const SGD_MULTI: [usize; 2] = [6, 5];

/// Immediates of `Kernel::SgdMulti` with `slots` slots, in u32s: four per slot, then flags and
/// four floats.
pub const fn sgd_multi_immediates(slots: usize) -> usize {
    4 * slots + 5
}

/// The most parameters one `Kernel::SgdMulti` launch takes on an adapter that allows
/// `storage_buffers` per shader stage and `immediate_bytes` of immediates.
pub fn sgd_multi_slots(storage_buffers: u32, immediate_bytes: u32) -> Option<usize> {
    SGD_MULTI.into_iter().find(|&n| {
        let k = super::Kernel::SgdMulti(crate::base::DType::F32, n);
        storage_buffers >= k.bindings() && immediate_bytes >= k.immediate_size()
    })
}

/// `shaders/optim_multi.wgsl` for `slots` slots, before the dtype's substitution.
pub(crate) fn sgd_multi_source(slots: usize) -> String {
    multi_source(include_str!("../../shaders/optim_multi.wgsl"), slots, |j| {
        let bindings = ["w", "g", "m"]
            .iter()
            .enumerate()
            .map(|(b, name)| {
                format!(
                    "@group(0) @binding({}) var<storage, read_write> {name}{j}: array<{{{{E}}}}>;\n",
                    3 * j + b
                )
            })
            .collect();
        [
            format!("    n{j}: u32,\n    po{j}: u32,\n    go{j}: u32,\n    mo{j}: u32,\n"),
            bindings,
            format!(
                "        case {j}u: {{
            var m_in = {{{{E}}}}();
            if momentum && !first {{
                m_in = m{j}[p.mo{j} + i];
            }}
            let w_in = w{j}[p.po{j} + i];
            var u = sgd(w_in, g{j}[p.go{j} + i], m_in, first);
            if tail != 0u && i + 1u == p.n{j} {{
                // The partial last vec4: its elements past the count keep their values.
                let keep = vec4<u32>(0u, 1u, 2u, 3u) >= vec4<u32>(tail);
                u.param = select(u.param, w_in, keep);
                if momentum {{
                    u.buf = select(u.buf, m{j}[p.mo{j} + i], keep);
                }}
            }}
            if momentum {{
                m{j}[p.mo{j} + i] = u.buf;
            }}
            w{j}[p.po{j} + i] = u.param;
        }}
"
            ),
        ]
    })
}

/// A multi-tensor kernel's WGSL (`optim_multi.wgsl`, `amp_multi.wgsl`) for `n` slots: each
/// slot's immediates, bindings and switch case (`slot(j)`) written in, and `multi_slot.wgsl`'s
/// entry point, which deals out the workgroups by the slots' counts (`p.n0`, `p.n1`, ...).
pub(crate) fn multi_source(
    template: &str,
    n: usize,
    slot: impl Fn(usize) -> [String; 3],
) -> String {
    let [mut fields, mut bindings, mut cases] = [String::new(), String::new(), String::new()];
    for j in 0..n {
        let [f, b, c] = slot(j);
        fields += &f;
        bindings += &b;
        cases += &c;
    }
    let counts: Vec<String> = (0..n).map(|j| format!("p.n{j}")).collect();
    template
        .replace("{{FIELDS}}", &fields)
        .replace("{{BINDINGS}}", &bindings)
        .replace("{{CASES}}", &cases)
        .replace("{{DEAL}}", include_str!("../../shaders/multi_slot.wgsl"))
        .replace("{{COUNTS}}", &counts.join(", "))
        .replace("{{N}}", &n.to_string())
}
