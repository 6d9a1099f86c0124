//! Convolution and pooling parameters (PyTorch's `stride`, `padding`, `dilation`, `groups`), shared
//! by the CPU device, the kernels and the ops.

/// Stride, padding and dilation per spatial dim (height, width).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Step between windows, (rows, columns).
    pub stride: (usize, usize),
    /// Zeros added on each side, (rows, columns).
    pub padding: (usize, usize),
    /// Spacing between a window's taps, (rows, columns).
    pub dilation: (usize, usize),
    /// Groups of channels convolved separately.
    pub groups: usize,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams {
            stride: (1, 1),
            padding: (0, 0),
            dilation: (1, 1),
            groups: 1,
        }
    }
}

impl Conv2dParams {
    /// Stride, padding and dilation, height before width: the order every convolution kernel's
    /// immediates take them in.
    pub(crate) fn window(&self) -> [usize; 6] {
        [
            self.stride.0,
            self.stride.1,
            self.padding.0,
            self.padding.1,
            self.dilation.0,
            self.dilation.1,
        ]
    }
}
