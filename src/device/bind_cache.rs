//! Bind groups cached by (bind-group layout, bound ranges): each compiled kernel has its own
//! layout, so the layout stands for the kernel without this layer knowing kernels. A cached group keeps its buffers alive, so the
//! wgpu segment source evicts a segment's groups when it releases the segment; otherwise
//! `empty_cache` would return nothing. See Note [Bind-group cache] in ARCHITECTURE.md.

use std::collections::HashMap;

/// Entries kept before the cache starts over (a training step binds a few hundred ranges).
const CAPACITY: usize = 8192;

type Key = (wgpu::BindGroupLayout, Vec<(wgpu::Buffer, u64, u64)>);

#[derive(Default)]
pub(crate) struct BindGroupCache {
    groups: HashMap<Key, wgpu::BindGroup>,
}

impl BindGroupCache {
    pub fn get_or_create(
        &mut self,
        device: &wgpu::Device,
        layout: &wgpu::BindGroupLayout,
        bindings: &[wgpu::BufferBinding<'_>],
    ) -> wgpu::BindGroup {
        let key: Key = (
            layout.clone(),
            bindings
                .iter()
                .map(|b| (b.buffer.clone(), b.offset, b.size.map_or(0, |s| s.get())))
                .collect(),
        );
        if let Some(g) = self.groups.get(&key) {
            return g.clone();
        }
        if self.groups.len() >= CAPACITY {
            self.groups.clear();
        }
        let entries: Vec<wgpu::BindGroupEntry> = bindings
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu::BindingResource::Buffer(b.clone()),
            })
            .collect();
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout,
            entries: &entries,
        });
        self.groups.insert(key, group.clone());
        group
    }

    /// Drops every group that binds `buffer`.
    pub fn evict(&mut self, buffer: &wgpu::Buffer) {
        self.groups
            .retain(|(_, ranges), _| ranges.iter().all(|(b, _, _)| b != buffer));
    }
}
