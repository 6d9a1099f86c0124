//! torchvision's ResNets (`torchvision.models.resnet18/resnet50`, the v1.5 layout: the stride
//! of a bottleneck on its 3x3 convolution), with torchvision's module tree, so that parameter
//! and buffer names match (`layer1.0.conv1.weight`, `layer1.0.downsample.1.running_var`,
//! `fc.bias`) and a torchvision state dict saved as safetensors loads by name; and its
//! initialisation (convolutions Kaiming-normal on fan_out for ReLU, BatchNorm weight 1 and
//! bias 0, `fc` as `Linear`'s default).

use crate::nn::{
    prefixed, AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Linear, MaxPool2d, Module, ReluInplace,
};
use crate::ops::Conv2dParams;
use crate::tensor::{DType, Tensor};
use crate::{Device, Result};

/// A bias-free convolution initialised as torchvision does: N(0, sqrt(2 / fan_out)).
fn conv(
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    padding: usize,
    device: &Device,
) -> Result<Conv2d> {
    let std = (2.0 / (cout * k * k) as f64).sqrt();
    Ok(Conv2d {
        weight: Tensor::normal(&[cout, cin, k, k], 0.0, std, DType::F32, device)?
            .requires_grad_(true)?,
        bias: None,
        params: Conv2dParams {
            stride: (stride, stride),
            padding: (padding, padding),
            ..Default::default()
        },
    })
}

/// A child module and its name in the tree.
type Child = (String, Box<dyn Module>);

fn child(name: &str, m: impl Module + 'static) -> Child {
    (name.to_string(), Box::new(m))
}

/// A module made of named children, run in order by `forward` where the tree is a plain chain
/// (torchvision's `nn.Sequential` layers and `downsample`), and holding every child's
/// parameters under `name.`.
struct Named(Vec<Child>);

impl Named {
    fn get(&self, name: &str) -> &dyn Module {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, m)| m.as_ref())
            .expect("a child the model built")
    }
}

impl Module for Named {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        for (name, m) in &self.0 {
            let _scope = crate::alloc::kiln_scope(|| name.clone(), "kiln nn");
            y = m.forward(&y)?;
        }
        Ok(y)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.0
            .iter()
            .flat_map(|(n, m)| prefixed(n, m.named_parameters()))
            .collect()
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.0
            .iter()
            .flat_map(|(n, m)| prefixed(n, m.named_buffers()))
            .collect()
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.0
            .iter_mut()
            .flat_map(|(n, m)| prefixed(n, m.tensors_mut()))
            .collect()
    }
    fn train(&mut self, mode: bool) {
        for (_, m) in &mut self.0 {
            m.train(mode);
        }
    }
}

/// torchvision's `BasicBlock` (two 3x3 convolutions) or `Bottleneck` (1x1, 3x3 with the
/// stride, 1x1 to four times the width), with the identity or `downsample` added before the
/// last ReLU.
struct Block {
    body: Named,
    bottleneck: bool,
    downsample: Option<Named>,
}

impl Block {
    fn new(
        bottleneck: bool,
        cin: usize,
        planes: usize,
        stride: usize,
        device: &Device,
    ) -> Result<Block> {
        let expansion = if bottleneck { 4 } else { 1 };
        let cout = planes * expansion;
        let body = if bottleneck {
            Named(vec![
                child("conv1", conv(cin, planes, 1, 1, 0, device)?),
                child("bn1", BatchNorm2d::new(planes, device)?),
                child("conv2", conv(planes, planes, 3, stride, 1, device)?),
                child("bn2", BatchNorm2d::new(planes, device)?),
                child("conv3", conv(planes, cout, 1, 1, 0, device)?),
                child("bn3", BatchNorm2d::new(cout, device)?),
            ])
        } else {
            Named(vec![
                child("conv1", conv(cin, planes, 3, stride, 1, device)?),
                child("bn1", BatchNorm2d::new(planes, device)?),
                child("conv2", conv(planes, planes, 3, 1, 1, device)?),
                child("bn2", BatchNorm2d::new(planes, device)?),
            ])
        };
        let downsample = (stride != 1 || cin != cout)
            .then(|| -> Result<Named> {
                Ok(Named(vec![
                    child("0", conv(cin, cout, 1, stride, 0, device)?),
                    child("1", BatchNorm2d::new(cout, device)?),
                ]))
            })
            .transpose()?;
        Ok(Block {
            body,
            bottleneck,
            downsample,
        })
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let stages: &[(&str, &str)] = if self.bottleneck {
            &[("conv1", "bn1"), ("conv2", "bn2"), ("conv3", "bn3")]
        } else {
            &[("conv1", "bn1"), ("conv2", "bn2")]
        };
        let mut y = x.clone();
        for (i, (c, b)) in stages.iter().enumerate() {
            let _scope = crate::alloc::kiln_scope(|| c.to_string(), "kiln nn");
            let (conv, bn) = (self.body.get(c), self.body.get(b));
            // bn -> relu inside the block in one fused pass (torchvision's `self.relu`).
            y = match i + 1 < stages.len() {
                true => bn.forward_relu(&conv.forward(&y)?)?,
                false => bn.forward(&conv.forward(&y)?)?,
            };
        }
        let identity = match &self.downsample {
            Some(d) => {
                let _scope = crate::alloc::kiln_scope(|| "downsample".to_string(), "kiln nn");
                d.forward(x)?
            }
            None => x.clone(),
        };
        // torchvision's `out += identity; out = self.relu(out)`, in one pass.
        y.add_relu(&identity)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = self.body.named_parameters();
        if let Some(d) = &self.downsample {
            v.extend(prefixed("downsample", d.named_parameters()));
        }
        v
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut v = self.body.named_buffers();
        if let Some(d) = &self.downsample {
            v.extend(prefixed("downsample", d.named_buffers()));
        }
        v
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v = self.body.tensors_mut();
        if let Some(d) = &mut self.downsample {
            v.extend(prefixed("downsample", d.tensors_mut()));
        }
        v
    }
    fn train(&mut self, mode: bool) {
        self.body.train(mode);
        if let Some(d) = &mut self.downsample {
            d.train(mode);
        }
    }
}

/// A torchvision ResNet: `conv1`, `bn1`, ReLU, 3x3 max pool (stride 2), `layer1`..`layer4`,
/// global average pool, flatten, `fc`.
pub struct ResNet {
    root: Named,
}

impl ResNet {
    fn new(
        bottleneck: bool,
        layers: [usize; 4],
        num_classes: usize,
        device: &Device,
    ) -> Result<Self> {
        let expansion = if bottleneck { 4 } else { 1 };
        let mut children = vec![
            child("conv1", conv(3, 64, 7, 2, 3, device)?),
            child("bn1", BatchNorm2d::new(64, device)?),
            child("relu", ReluInplace),
            child(
                "maxpool",
                MaxPool2d {
                    kernel: 3,
                    stride: 2,
                    padding: 1,
                },
            ),
        ];
        let mut cin = 64;
        for (i, &blocks) in layers.iter().enumerate() {
            let planes = 64 << i;
            let mut layer = Vec::with_capacity(blocks);
            for b in 0..blocks {
                let stride = if i > 0 && b == 0 { 2 } else { 1 };
                layer.push(child(
                    &b.to_string(),
                    Block::new(bottleneck, cin, planes, stride, device)?,
                ));
                cin = planes * expansion;
            }
            children.push(child(&format!("layer{}", i + 1), Named(layer)));
        }
        children.push(child("avgpool", AdaptiveAvgPool2d::new((1, 1))));
        children.push(child("flatten", crate::nn::Flatten));
        children.push(child(
            "fc",
            Linear::new(512 * expansion, num_classes, true, device)?,
        ));
        Ok(ResNet {
            root: Named(children),
        })
    }
}

impl Module for ResNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.root.forward(x)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.root.named_parameters()
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.root.named_buffers()
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.root.tensors_mut()
    }
    fn train(&mut self, mode: bool) {
        self.root.train(mode);
    }
}

/// `torchvision.models.resnet18(num_classes=...)`: 11,689,512 parameters at 1000 classes.
pub fn resnet18(num_classes: usize, device: &Device) -> Result<ResNet> {
    ResNet::new(false, [2, 2, 2, 2], num_classes, device)
}

/// `torchvision.models.resnet50(num_classes=...)`: 25,557,032 parameters at 1000 classes.
pub fn resnet50(num_classes: usize, device: &Device) -> Result<ResNet> {
    ResNet::new(true, [3, 4, 6, 3], num_classes, device)
}
