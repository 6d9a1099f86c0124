//! The optimizers' kernels: `shaders/optim.wgsl` (one parameter per launch, any float layout)
//! and `shaders/optim_multi.wgsl` (SGD over up to `SGD_MULTI` parameters per launch, its WGSL
//! written out per slot: WGSL cannot index bindings, so each slot gets its own bindings,
//! count, offsets and case of the kernel's switch).

/// The fused optimizer updates (entry points of `shaders/optim.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OptimKernel {
    Sgd,
    Adam,
    /// The same updates four elements per invocation (vec4 loads: counts and offsets divisible
    /// by 4), which is what reaches HBM bandwidth.
    Sgd4,
    Adam4,
}

impl OptimKernel {
    pub const ALL: [OptimKernel; 4] = [
        OptimKernel::Sgd,
        OptimKernel::Adam,
        OptimKernel::Sgd4,
        OptimKernel::Adam4,
    ];

    pub(crate) fn entry_point(self) -> &'static str {
        match self {
            OptimKernel::Sgd | OptimKernel::Sgd4 => "sgd",
            OptimKernel::Adam | OptimKernel::Adam4 => "adam",
        }
    }

    pub(crate) fn vec4(self) -> bool {
        matches!(self, OptimKernel::Sgd4 | OptimKernel::Adam4)
    }
}

/// Parameters per launch of `Kernel::SgdMulti`: three storage buffers each (15 in all: GL's
/// llvmpipe allows 16, lavapipe 32) and 25 immediates (100 bytes: lavapipe allows 128).
/// Five covers an MLP's layers' weights and biases in one launch.
pub const SGD_MULTI: usize = 5;

/// Immediates of `Kernel::SgdMulti`, in u32s: four per slot, then flags and four floats.
pub const SGD_MULTI_IMMEDIATES: usize = 4 * SGD_MULTI + 5;

/// `shaders/optim_multi.wgsl` for `SGD_MULTI` slots, before the dtype's substitution.
pub(crate) fn sgd_multi_source() -> String {
    multi_source(
        include_str!("../../shaders/optim_multi.wgsl"),
        SGD_MULTI,
        |j| {
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
            let u = sgd(w{j}[p.po{j} + i], g{j}[p.go{j} + i], m_in, first);
            if momentum {{
                m{j}[p.mo{j} + i] = u.buf;
            }}
            w{j}[p.po{j} + i] = u.param;
        }}
"
                ),
            ]
        },
    )
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
