//! Elementwise ops: each op's WGSL (over `x`, `y` in the compute type: f32 for float tensors,
//! opmath as in PyTorch; i32/u32 for integer ones) and its CPU reference sit side by side.

/// One-input ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `x` unchanged (a copy).
    Identity,
    /// `-x`
    Neg,
    /// `|x|`
    Abs,
    /// `e^x`
    Exp,
    /// The natural logarithm.
    Log,
    /// `sqrt(x)`
    Sqrt,
    /// `1 / sqrt(x)`
    Rsqrt,
    /// `1 / x`
    Reciprocal,
    /// `x * x`
    Square,
    /// `sin(x)`
    Sin,
    /// `cos(x)`
    Cos,
    /// `tanh(x)`
    Tanh,
    /// `1 / (1 + e^-x)`
    Sigmoid,
    /// `max(x, 0)`
    Relu,
    /// GELU with the exact erf, PyTorch's default.
    Gelu,
    /// GELU with the tanh approximation (`approximate="tanh"`).
    GeluTanh,
    /// `x * sigmoid(x)` (SiLU, swish).
    Silu,
}

/// Two-input ops (with NumPy broadcasting), also with a scalar as the second operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `x + y`
    Add,
    /// `x - y`
    Sub,
    /// `x * y`
    Mul,
    /// `x / y`
    Div,
    /// `x ^ y`
    Pow,
    /// The larger of the two (NaN wins, as PyTorch's `maximum`).
    Maximum,
    /// The smaller of the two (NaN wins, as PyTorch's `minimum`).
    Minimum,
    /// The second operand: `copy_` and `fill_`.
    Right,
    /// `relu(x + y)`: a residual add and the ReLU after it in one pass (kiln's; PyTorch's
    /// ResNet blocks run `out += identity; relu(out)`), floats only.
    AddRelu,
    /// The backward of a unary op: `x` is what its backward saved (the input, or the output
    /// where `UnaryOp::grad_from_output`), `y` the gradient of the output.
    Grad(UnaryOp),
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 17] = [
        UnaryOp::Identity,
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Reciprocal,
        UnaryOp::Square,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
    ];

    /// PyTorch's name (`neg`, `exp`, `gelu`, ...).
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Identity => "copy",
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Reciprocal => "reciprocal",
            UnaryOp::Square => "square",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Silu => "silu",
        }
    }

    /// WGSL for floats (computed in f32).
    pub fn wgsl_float(self) -> &'static str {
        match self {
            UnaryOp::Identity => "x",
            UnaryOp::Neg => "-x",
            UnaryOp::Abs => "abs(x)",
            UnaryOp::Exp => "exp(x)",
            UnaryOp::Log => "log(x)",
            UnaryOp::Sqrt => "sqrt(x)",
            UnaryOp::Rsqrt => "inverseSqrt(x)",
            UnaryOp::Reciprocal => "1.0 / x",
            UnaryOp::Square => "x * x",
            UnaryOp::Sin => "sin(x)",
            UnaryOp::Cos => "cos(x)",
            // Clamped: some drivers compute tanh as a ratio of exponentials that overflows.
            UnaryOp::Tanh => "tanh(clamp(x, -10.0, 10.0))",
            UnaryOp::Sigmoid => "1.0 / (1.0 + exp(-x))",
            // NaN stays NaN (PyTorch); GL gives no NaN promise for `<`, hence the bit test.
            UnaryOp::Relu => "select(x, 0.0, x < 0.0 && !k_isnan(x))",
            UnaryOp::Gelu => "0.5 * x * (1.0 + k_erf(x * 0.70710678118654752))",
            // 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)): one exponential and a division where
            // `tanh` cost NVIDIA's compiler about 90 instructions an element (the kernel was
            // bound by them, not by memory); `k_gelu_e` (shaders/math.wgsl) caps the exponent.
            UnaryOp::GeluTanh => "x / (1.0 + k_gelu_e(x))",
            UnaryOp::Silu => "x / (1.0 + exp(-x))",
        }
    }

    /// WGSL for integers, where the op takes them (PyTorch promotes the others to float).
    pub fn wgsl_int(self, signed: bool) -> Option<&'static str> {
        match self {
            UnaryOp::Identity => Some("x"),
            UnaryOp::Neg if signed => Some("-x"),
            UnaryOp::Abs if signed => Some("abs(x)"),
            UnaryOp::Abs => Some("x"),
            UnaryOp::Square => Some("x * x"),
            UnaryOp::Relu if signed => Some("max(x, 0)"),
            UnaryOp::Relu => Some("x"),
            _ => None,
        }
    }

    /// The CPU reference, in f64.
    pub fn cpu(self, x: f64) -> f64 {
        match self {
            UnaryOp::Identity => x,
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Reciprocal => 1.0 / x,
            UnaryOp::Square => x * x,
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            UnaryOp::Gelu => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
            UnaryOp::GeluTanh => {
                0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
            }
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
        }
    }

    /// Whether the backward needs the op's output rather than its input (PyTorch saves the
    /// result for exp, sqrt, rsqrt, reciprocal, tanh, sigmoid and relu).
    pub fn grad_from_output(self) -> bool {
        matches!(
            self,
            UnaryOp::Exp
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Reciprocal
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Relu
        )
    }

    /// The autograd node name, as PyTorch names it.
    pub fn backward_name(self) -> &'static str {
        match self {
            UnaryOp::Identity => "CloneBackward0",
            UnaryOp::Neg => "NegBackward0",
            UnaryOp::Abs => "AbsBackward0",
            UnaryOp::Exp => "ExpBackward0",
            UnaryOp::Log => "LogBackward0",
            UnaryOp::Sqrt => "SqrtBackward0",
            UnaryOp::Rsqrt => "RsqrtBackward0",
            UnaryOp::Reciprocal => "ReciprocalBackward0",
            UnaryOp::Square => "PowBackward0",
            UnaryOp::Sin => "SinBackward0",
            UnaryOp::Cos => "CosBackward0",
            UnaryOp::Tanh => "TanhBackward0",
            UnaryOp::Sigmoid => "SigmoidBackward0",
            UnaryOp::Relu => "ReluBackward0",
            UnaryOp::Gelu | UnaryOp::GeluTanh => "GeluBackward0",
            UnaryOp::Silu => "SiluBackward0",
        }
    }

    /// WGSL of the gradient of the input from `x` (saved input or output) and `y` (the output's
    /// gradient), in f32.
    pub fn grad_wgsl(self) -> &'static str {
        match self {
            UnaryOp::Identity => "y",
            UnaryOp::Neg => "-y",
            UnaryOp::Abs => "y * sign(x)",
            UnaryOp::Exp => "y * x",
            UnaryOp::Log => "y / x",
            UnaryOp::Sqrt => "y / (2.0 * x)",
            UnaryOp::Rsqrt => "-0.5 * y * x * x * x",
            UnaryOp::Reciprocal => "-y * x * x",
            UnaryOp::Square => "2.0 * x * y",
            UnaryOp::Sin => "y * cos(x)",
            UnaryOp::Cos => "-y * sin(x)",
            UnaryOp::Tanh => "y * (1.0 - x * x)",
            UnaryOp::Sigmoid => "y * x * (1.0 - x)",
            // PyTorch's threshold_backward: zero where the output is <= 0, the gradient
            // elsewhere (a NaN output passes it).
            UnaryOp::Relu => "select(y, 0.0, x <= 0.0)",
            UnaryOp::Gelu => {
                "y * (0.5 * (1.0 + k_erf(x * 0.70710678118654752)) + x * 0.3989422804014327 * exp(-0.5 * x * x))"
            }
            // With e = exp(-2u) (`k_gelu_e`, capped) and s = 1 / (1 + e) = 0.5 (1 + tanh u):
            // s + 0.5 x (1 - tanh^2 u) u' = s + 2k x s (1 - s) (1 + 0.134145 x^2), s (1 - s) =
            // e / (1 + e)^2. x meets that factor before the polynomial, as PyTorch's x meets
            // 1 - tanh^2 u: far in the negative tail it is 0 x (a huge number) = 0, not NaN.
            UnaryOp::GeluTanh => {
                "y * (1.0 / (1.0 + k_gelu_e(x)) + 1.5957691216057308 * (x * (k_gelu_e(x) / ((1.0 + k_gelu_e(x)) * (1.0 + k_gelu_e(x))))) * (1.0 + 0.134145 * x * x))"
            }
            UnaryOp::Silu => {
                "y * (1.0 / (1.0 + exp(-x))) * (1.0 + x * (1.0 - 1.0 / (1.0 + exp(-x))))"
            }
        }
    }

    /// The CPU reference of `grad_wgsl`, in f64.
    pub fn grad_cpu(self, x: f64, y: f64) -> f64 {
        let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
        match self {
            UnaryOp::Identity => y,
            UnaryOp::Neg => -y,
            UnaryOp::Abs => {
                if x > 0.0 {
                    y
                } else if x < 0.0 {
                    -y
                } else {
                    0.0
                }
            }
            UnaryOp::Exp => y * x,
            UnaryOp::Log => y / x,
            UnaryOp::Sqrt => y / (2.0 * x),
            UnaryOp::Rsqrt => -0.5 * y * x * x * x,
            UnaryOp::Reciprocal => -y * x * x,
            UnaryOp::Square => 2.0 * x * y,
            UnaryOp::Sin => y * x.cos(),
            UnaryOp::Cos => -y * x.sin(),
            UnaryOp::Tanh => y * (1.0 - x * x),
            UnaryOp::Sigmoid => y * x * (1.0 - x),
            UnaryOp::Relu => {
                if x <= 0.0 {
                    0.0
                } else {
                    y
                }
            }
            UnaryOp::Gelu => {
                let cdf = 0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
                let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
                y * (cdf + x * pdf)
            }
            UnaryOp::GeluTanh => {
                let t = (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh();
                y * (0.5 * (1.0 + t)
                    + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 0.134145 * x * x))
            }
            UnaryOp::Silu => {
                let s = sigmoid(x);
                y * s * (1.0 + x * (1.0 - s))
            }
        }
    }
}

impl BinaryOp {
    /// The backward kernels of the unary ops that have one of their own.
    pub const GRADS: [BinaryOp; 15] = [
        BinaryOp::Grad(UnaryOp::Abs),
        BinaryOp::Grad(UnaryOp::Exp),
        BinaryOp::Grad(UnaryOp::Log),
        BinaryOp::Grad(UnaryOp::Sqrt),
        BinaryOp::Grad(UnaryOp::Rsqrt),
        BinaryOp::Grad(UnaryOp::Reciprocal),
        BinaryOp::Grad(UnaryOp::Square),
        BinaryOp::Grad(UnaryOp::Sin),
        BinaryOp::Grad(UnaryOp::Cos),
        BinaryOp::Grad(UnaryOp::Tanh),
        BinaryOp::Grad(UnaryOp::Sigmoid),
        BinaryOp::Grad(UnaryOp::Relu),
        BinaryOp::Grad(UnaryOp::Gelu),
        BinaryOp::Grad(UnaryOp::GeluTanh),
        BinaryOp::Grad(UnaryOp::Silu),
    ];

    /// Every binary op but the gradient forms.
    pub const ALL: [BinaryOp; 9] = [
        BinaryOp::Add,
        BinaryOp::AddRelu,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Right,
    ];

    /// PyTorch's name (`add`, `mul`, `maximum`, ...).
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::AddRelu => "add_relu",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Right => "copy",
            BinaryOp::Grad(op) => op.backward_name(),
        }
    }

    /// The op as a WGSL expression over `x` and `y` in the float compute type.
    pub fn wgsl_float(self) -> &'static str {
        match self {
            BinaryOp::Add => "x + y",
            // ReLU's own form over the sum: NaN passes.
            BinaryOp::AddRelu => "select(x + y, 0.0, x + y < 0.0 && !k_isnan(x + y))",
            BinaryOp::Sub => "x - y",
            BinaryOp::Mul => "x * y",
            BinaryOp::Div => "x / y",
            BinaryOp::Pow => "k_pow(x, y)",
            BinaryOp::Maximum => "k_max(x, y)",
            BinaryOp::Minimum => "k_min(x, y)",
            BinaryOp::Right => "y",
            BinaryOp::Grad(op) => op.grad_wgsl(),
        }
    }

    /// Integer forms wrap on overflow, as PyTorch's do. Division and pow of integers promote
    /// to float in PyTorch; kiln asks for an explicit cast instead.
    pub fn wgsl_int(self) -> Option<&'static str> {
        match self {
            BinaryOp::Add => Some("x + y"),
            BinaryOp::Sub => Some("x - y"),
            BinaryOp::Mul => Some("x * y"),
            BinaryOp::Maximum => Some("max(x, y)"),
            BinaryOp::Minimum => Some("min(x, y)"),
            BinaryOp::Right => Some("y"),
            BinaryOp::Div | BinaryOp::Pow | BinaryOp::AddRelu | BinaryOp::Grad(_) => None,
        }
    }

    /// The CPU reference of the op, in f64.
    pub fn cpu(self, x: f64, y: f64) -> f64 {
        match self {
            BinaryOp::Grad(op) => op.grad_cpu(x, y),
            BinaryOp::Right => y,
            BinaryOp::Add => x + y,
            BinaryOp::AddRelu => UnaryOp::Relu.cpu(x + y),
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
            BinaryOp::Pow => x.powf(y),
            BinaryOp::Maximum => {
                if x.is_nan() || y.is_nan() {
                    f64::NAN
                } else {
                    x.max(y)
                }
            }
            BinaryOp::Minimum => {
                if x.is_nan() || y.is_nan() {
                    f64::NAN
                } else {
                    x.min(y)
                }
            }
        }
    }

    /// Integer reference with wrapping (`i64` arithmetic, wrapped by the store).
    pub fn cpu_int(self, x: i64, y: i64) -> i64 {
        match self {
            BinaryOp::Add => x.wrapping_add(y),
            BinaryOp::Sub => x.wrapping_sub(y),
            BinaryOp::Mul => x.wrapping_mul(y),
            BinaryOp::Maximum => x.max(y),
            BinaryOp::Minimum => x.min(y),
            BinaryOp::Right => y,
            BinaryOp::Div | BinaryOp::Pow | BinaryOp::AddRelu | BinaryOp::Grad(_) => {
                unreachable!("refused before dispatch")
            }
        }
    }
}
