//! The layers: Linear, Conv2d, MaxPool2d, BatchNorm, LayerNorm, Embedding, Dropout,
//! activations, Flatten, Sequential. Initialisation follows PyTorch's `reset_parameters`.

use super::{init, prefixed, Module};
use crate::ops::Conv2dParams;
use crate::tensor::{DType, Tensor};
use crate::{Device, Error, Result};

fn param(t: Tensor) -> Result<Tensor> {
    t.requires_grad_(true)
}

/// `weight` and the optional `bias`, named as PyTorch names them (Linear, Conv2d).
fn weight_and_bias<'a>(
    weight: &'a Tensor,
    bias: &'a Option<Tensor>,
) -> impl Iterator<Item = (&'static str, &'a Tensor)> {
    std::iter::once(("weight", weight)).chain(bias.iter().map(|b| ("bias", b)))
}

/// `y = x @ weight.t() + bias`; weight [out, in].
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Tensor,
    /// `[out_features]`, if the layer has a bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// PyTorch's init: weight and bias uniform in ±1/sqrt(in_features).
    pub fn new(
        in_features: usize,
        out_features: usize,
        bias: bool,
        device: &Device,
    ) -> Result<Self> {
        let bound = 1.0 / (in_features.max(1) as f64).sqrt();
        let weight = param(Tensor::uniform(
            &[out_features, in_features],
            -bound,
            bound,
            DType::F32,
            device,
        )?)?;
        let bias = match bias {
            true => Some(param(Tensor::uniform(
                &[out_features],
                -bound,
                bound,
                DType::F32,
                device,
            )?)?),
            false => None,
        };
        Ok(Linear { weight, bias })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        crate::ops::linear(x, &self.weight, self.bias.as_ref())
    }
    fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_then_relu(x)
    }
    /// The ReLU in the product's epilogue where it can (`ops::linear_relu`).
    fn forward_then_relu(&self, x: &Tensor) -> Result<Tensor> {
        crate::ops::linear_relu(x, &self.weight, self.bias.as_ref())
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        weight_and_bias(&self.weight, &self.bias)
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect()
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v = vec![("weight".to_string(), &mut self.weight)];
        v.extend(self.bias.iter_mut().map(|b| ("bias".to_string(), b)));
        v
    }
}

/// 2-D convolution over [N, C, H, W]; weight [out, in / groups, kh, kw].
pub struct Conv2d {
    /// `[out_channels, in_channels / groups, kh, kw]`.
    pub weight: Tensor,
    /// `[out_channels]`, if the layer has a bias.
    pub bias: Option<Tensor>,
    /// Stride, padding, dilation and groups.
    pub params: Conv2dParams,
}

impl Conv2d {
    /// PyTorch's init: weight and bias uniform in ±1/sqrt(fan_in).
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        params: Conv2dParams,
        device: &Device,
    ) -> Result<Self> {
        let shape = [
            out_channels,
            in_channels / params.groups.max(1),
            kernel,
            kernel,
        ];
        let (fan_in, _) = init::fans(&shape)?;
        let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
        Ok(Conv2d {
            weight: param(Tensor::uniform(&shape, -bound, bound, DType::F32, device)?)?,
            bias: Some(param(Tensor::uniform(
                &[out_channels],
                -bound,
                bound,
                DType::F32,
                device,
            )?)?),
            params,
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        crate::ops::conv2d(x, &self.weight, self.bias.as_ref(), self.params)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        weight_and_bias(&self.weight, &self.bias)
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect()
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v = vec![("weight".to_string(), &mut self.weight)];
        v.extend(self.bias.iter_mut().map(|b| ("bias".to_string(), b)));
        v
    }
}

/// Max pooling with a square window (stride defaults to the window, as in PyTorch).
pub struct MaxPool2d {
    /// The window's side.
    pub kernel: usize,
    /// The step between windows.
    pub stride: usize,
    /// Padding on each side (padded cells never win the max).
    pub padding: usize,
}

impl MaxPool2d {
    /// A `kernel` x `kernel` window with stride `kernel` and no padding.
    pub fn new(kernel: usize) -> Self {
        MaxPool2d {
            kernel,
            stride: kernel,
            padding: 0,
        }
    }
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        crate::ops::max_pool2d(
            x,
            (self.kernel, self.kernel),
            (self.stride, self.stride),
            (self.padding, self.padding),
        )
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }
}

/// Batch normalisation over dim 1 of [N, C] or [N, C, H, W], with running statistics updated
/// in training mode (momentum 0.1, unbiased running variance) and used in evaluation mode.
pub struct BatchNorm {
    /// The scale, `[C]`, initialised to ones.
    pub weight: Tensor,
    /// The shift, `[C]`, initialised to zeros.
    pub bias: Tensor,
    /// The running mean, `[C]` (a buffer, not a parameter).
    pub running_mean: Tensor,
    /// The running variance, `[C]` (a buffer).
    pub running_var: Tensor,
    /// Training-mode forward passes so far (an i32 0-d tensor; PyTorch's is int64).
    pub num_batches_tracked: Tensor,
    /// Added to the variance before the square root (1e-5).
    pub eps: f64,
    /// The running statistics' update weight (0.1).
    pub momentum: f64,
    training: bool,
}

/// PyTorch's name for the 4-D use of `BatchNorm` (which also takes [N, C]).
pub type BatchNorm2d = BatchNorm;

impl BatchNorm {
    /// Batch normalisation over `num_features` channels on `device`.
    pub fn new(num_features: usize, device: &Device) -> Result<Self> {
        Ok(BatchNorm {
            weight: param(Tensor::ones(&[num_features], DType::F32, device)?)?,
            bias: param(Tensor::zeros(&[num_features], DType::F32, device)?)?,
            running_mean: Tensor::zeros(&[num_features], DType::F32, device)?,
            running_var: Tensor::ones(&[num_features], DType::F32, device)?,
            num_batches_tracked: Tensor::zeros(&[], DType::I32, device)?,
            eps: 1e-5,
            momentum: 0.1,
            training: true,
        })
    }

    /// `ops::batch_norm` (or `batch_norm_relu`) with this layer's state (which casts to f32
    /// under autocast).
    fn forward_f32(&self, x: &Tensor, relu: bool) -> Result<Tensor> {
        // `num_batches_tracked += 1` in training, inside the op's own launches where it can.
        crate::ops::batch_norm_counted(
            x,
            [Some(&self.running_mean), Some(&self.running_var)],
            [Some(&self.weight), Some(&self.bias)],
            self.training,
            [self.momentum, self.eps],
            relu,
            Some(&self.num_batches_tracked),
        )
    }
}

impl Module for BatchNorm {
    /// In f32 under autocast, as PyTorch's batch_norm.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_f32(x, false)
    }
    /// The normalisation with the ReLU fused into its passes (`ops::batch_norm_relu`).
    fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_f32(x, true)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".into(), self.weight.clone()),
            ("bias".into(), self.bias.clone()),
        ]
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        vec![
            ("running_mean".into(), self.running_mean.clone()),
            ("running_var".into(), self.running_var.clone()),
            (
                "num_batches_tracked".into(),
                self.num_batches_tracked.clone(),
            ),
        ]
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![
            ("weight".into(), &mut self.weight),
            ("bias".into(), &mut self.bias),
            ("running_mean".into(), &mut self.running_mean),
            ("running_var".into(), &mut self.running_var),
            ("num_batches_tracked".into(), &mut self.num_batches_tracked),
        ]
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
    }
}

/// `nn.LayerNorm`: normalisation over the trailing `normalized_shape` dims on the fused kernel
/// (`ops::layer_norm`), with an elementwise affine weight (ones) and bias (zeros) by default.
pub struct LayerNorm {
    /// The dims normalised over, last dims of the input.
    pub normalized_shape: Vec<usize>,
    /// The scale, initialised to ones (`None` without `elementwise_affine`).
    pub weight: Option<Tensor>,
    /// The shift, initialised to zeros (`None` without `elementwise_affine` or `bias`).
    pub bias: Option<Tensor>,
    /// Added to the variance before the square root (1e-5).
    pub eps: f64,
}

impl LayerNorm {
    /// `nn.LayerNorm(features)`: over a last dim of `features`, with weight and bias.
    pub fn new(features: usize, device: &Device) -> Result<Self> {
        LayerNorm::with_options(&[features], 1e-5, true, true, device)
    }

    /// `nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias)`.
    pub fn with_options(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
        bias: bool,
        device: &Device,
    ) -> Result<Self> {
        let (weight, bias) = match elementwise_affine {
            true => (
                Some(param(Tensor::ones(normalized_shape, DType::F32, device)?)?),
                match bias {
                    true => Some(param(Tensor::zeros(normalized_shape, DType::F32, device)?)?),
                    false => None,
                },
            ),
            false => (None, None),
        };
        Ok(LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            weight,
            bias,
            eps,
        })
    }
}

impl Module for LayerNorm {
    /// In f32 under autocast, as PyTorch's layer_norm.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        crate::ops::layer_norm(
            x,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        [("weight", &self.weight), ("bias", &self.bias)]
            .into_iter()
            .filter_map(|(n, t)| t.as_ref().map(|t| (n.to_string(), t.clone())))
            .collect()
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        [("weight", &mut self.weight), ("bias", &mut self.bias)]
            .into_iter()
            .filter_map(|(n, t)| t.as_mut().map(|t| (n.to_string(), t)))
            .collect()
    }
}

/// A lookup table [num_embeddings, dim], initialised N(0, 1); input: i32 ids.
pub struct Embedding {
    /// `[num_embeddings, dim]`.
    pub weight: Tensor,
}

impl Embedding {
    /// A table of `num_embeddings` rows of `dim`, on `device`.
    pub fn new(num_embeddings: usize, dim: usize, device: &Device) -> Result<Self> {
        Ok(Embedding {
            weight: param(Tensor::randn(&[num_embeddings, dim], DType::F32, device)?)?,
        })
    }
}

impl Module for Embedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        crate::ops::embedding(&self.weight, ids)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".into(), self.weight.clone())]
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![("weight".into(), &mut self.weight)]
    }
}

/// Zeroes elements with probability `p` in training mode and scales the rest by 1/(1-p).
pub struct Dropout {
    /// The probability of zeroing an element.
    pub p: f64,
    training: bool,
}

impl Dropout {
    /// Dropout with probability `p`, in [0, 1).
    pub fn new(p: f64) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::InvalidArgument {
                op: "Dropout",
                msg: format!("dropout probability has to be in [0, 1), got {p}"),
            });
        }
        Ok(Dropout { p, training: true })
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training || self.p == 0.0 {
            return Ok(x.clone());
        }
        let keep = crate::no_grad(|| {
            x.detach()
                .rand_like()?
                .ge_scalar(self.p)?
                .to_dtype(x.dtype())?
                .mul_scalar(1.0 / (1.0 - self.p))
        })?;
        x.mul(&keep)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
    }
}

macro_rules! activation {
    ($($name:ident => $method:ident),* $(,)?) => {$(
        #[doc = concat!("The `", stringify!($method), "` activation as a module.")]
        pub struct $name;
        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                x.$method()
            }
            fn named_parameters(&self) -> Vec<(String, Tensor)> {
                Vec::new()
            }
            fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
                Vec::new()
            }
            fn is_relu(&self) -> bool {
                stringify!($method) == "relu"
            }
        }
    )*};
}

activation!(Relu => relu, Gelu => gelu, Silu => silu, Tanh => tanh, Sigmoid => sigmoid);

/// `nn.ReLU(inplace=True)`: writes the result into its input where autograd does not need
/// that input (no grad mode, or a tensor that does not require grad). kiln records no in-place
/// op in the graph (`Tensor::check_inplace`), so under autograd it computes out of place;
/// ReLU saves its output either way, so what backward keeps alive is the same as PyTorch's,
/// and the input is freed as soon as nothing else holds it.
pub struct ReluInplace;

impl Module for ReluInplace {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if crate::autograd::is_grad_enabled() && x.requires_grad() {
            return x.relu();
        }
        x.relu_()?;
        Ok(x.clone())
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }
}

/// `nn.AdaptiveAvgPool2d((oh, ow))`: output cell (i, j) averages input rows
/// floor(i*h/oh)..ceil((i+1)*h/oh) and the columns likewise, as PyTorch does.
pub struct AdaptiveAvgPool2d {
    /// The output's (height, width).
    pub output_size: (usize, usize),
}

impl AdaptiveAvgPool2d {
    /// Pooling to `output_size`.
    pub fn new(output_size: (usize, usize)) -> Self {
        AdaptiveAvgPool2d { output_size }
    }
}

impl Module for AdaptiveAvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        const OP: &str = "adaptive_avg_pool2d";
        let (oh, ow) = self.output_size;
        if x.rank() != 4 || oh == 0 || ow == 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!(
                    "expected a 4-D input and a positive output size, got {:?} and {:?}",
                    x.shape(),
                    self.output_size
                ),
            });
        }
        let (h, w) = (x.shape()[2], x.shape()[3]);
        if (oh, ow) == (1, 1) {
            return x.mean(&[2, 3], true);
        }
        if h % oh == 0 && w % ow == 0 {
            let k = (h / oh, w / ow);
            return crate::ops::avg_pool2d(x, k, k, (0, 0));
        }
        // Uneven windows: one mean per output cell, joined back.
        let mut rows = Vec::with_capacity(oh);
        for i in 0..oh {
            let (r0, r1) = (i * h / oh, ((i + 1) * h).div_ceil(oh));
            let mut cells = Vec::with_capacity(ow);
            for j in 0..ow {
                let (c0, c1) = (j * w / ow, ((j + 1) * w).div_ceil(ow));
                cells.push(
                    x.narrow(2, r0, r1 - r0)?
                        .narrow(3, c0, c1 - c0)?
                        .mean(&[2, 3], true)?,
                );
            }
            rows.push(Tensor::cat(&cells, 3)?);
        }
        Tensor::cat(&rows, 2)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }
}

/// Flattens every dim after the first.
pub struct Flatten;

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.flatten(1, -1)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }
}

/// Modules applied in order; parameters are named by position (`0.weight`).
#[derive(Default)]
pub struct Sequential {
    /// The layers, in order.
    pub layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty sequence; add layers with `push`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a layer (builder style).
    pub fn push(mut self, layer: impl Module + 'static) -> Self {
        self.layers.push(Box::new(layer));
        self
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        let mut i = 0;
        while let Some(layer) = self.layers.get(i) {
            // The module path in allocation frames, as PyTorch's stacks show `model.0`.
            let _scope = crate::alloc::kiln_scope(|| format!("Sequential.{i}"), "kiln nn");
            // A layer followed by `Relu` applies it (the same graph and allocations).
            if self.layers.get(i + 1).is_some_and(|next| next.is_relu()) {
                y = layer.forward_then_relu(&y)?;
                i += 2;
            } else {
                y = layer.forward(&y)?;
                i += 1;
            }
        }
        Ok(y)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            v.extend(prefixed(&i.to_string(), l.named_parameters()));
        }
        v
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            v.extend(prefixed(&i.to_string(), l.named_buffers()));
        }
        v
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v = Vec::new();
        for (i, l) in self.layers.iter_mut().enumerate() {
            v.extend(prefixed(&i.to_string(), l.tensors_mut()));
        }
        v
    }
    fn train(&mut self, mode: bool) {
        for l in &mut self.layers {
            l.train(mode);
        }
    }
}
