//! The fill kernel behind `fill_`/`zero_`, as `DeviceBlock::fill_u32`: host memory is set by the
//! device layer, GPU memory by one or more launches of `Kernel::Fill` over aligned chunks.

use super::{grid, pipelines, Kernel, WORKGROUP};
use crate::device::{lock, DeviceBlock};
use crate::Result;

impl DeviceBlock {
    /// Sets every 32-bit word of the block to `value`. Queued on the GPU; returns at once.
    pub fn fill_u32(&self, value: u32) -> Result<()> {
        if self.fill_host_u32(value)? {
            return Ok(());
        }
        let (Some((buffer, offset)), Some(g)) = (self.gpu_range(), self.device().gpu()) else {
            return Ok(());
        };
        // Whole words: a block is at least 512 bytes, so the last partial word is its own.
        let words = self.len_bytes().div_ceil(4);
        g.check("fill_u32")?;
        let kernel = lock(pipelines(g)).get(g, Kernel::Fill);
        let limits = &g.info.limits;
        // Bind at most the largest aligned range a binding may cover; loop over chunks.
        let align = limits.min_storage_buffer_offset_alignment as u64;
        let max_bind = (limits.max_storage_buffer_binding_size / align) * align;
        let max_words = (max_bind / 4)
            .min(WORKGROUP as u64 * limits.max_compute_workgroups_per_dimension as u64 * 65535);
        let mut done = 0u64;
        let mut stream = lock(&g.stream);
        while done < words {
            let n = (words - done).min(max_words);
            let bind_bytes = (n * 4).next_multiple_of(4);
            let bind_group = g.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("fill"),
                layout: &kernel.layout,
                entries: &[wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer,
                        offset: offset + done * 4,
                        size: wgpu::BufferSize::new(bind_bytes),
                    }),
                }],
            });
            let (x, y) = grid(n, limits.max_compute_workgroups_per_dimension);
            let pass = stream.pass(&g.device);
            pass.set_pipeline(&kernel.pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            let params = [n as u32, value];
            pass.set_immediates(0, bytemuck::cast_slice(&params));
            pass.dispatch_workgroups(x, y, 1);
            stream.recorded(&g.queue);
            done += n;
        }
        Ok(())
    }
}
