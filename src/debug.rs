//! Finding leaks: which tensors are alive, where they were made, and which of them keep an
//! autograd graph (and its saved activations) alive. Turn tracking on with `track_tensors(true)`
//! before the code under suspicion; tensors made while it is on are listed by `live_tensors()`
//! and grouped by `report()` so that the usual culprits (a stored loss, an undetached hidden
//! state, evaluation with grad mode on) stand out.
//!
//! The records themselves are kept where tensors and graphs are made (`tensor::live`,
//! `graph::live_graphs`); this module only reads them.

use crate::alloc::set_tensor_tracking;
use crate::graph::{forget_graphs, live_graphs, AutogradMeta};
use crate::tensor::live::tracked;
use crate::tensor::DType;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Starts (or stops) recording where tensors are made. While on, kiln's op, module and
/// optimizer scopes are pushed as in memory history, so each tensor knows its op and scope.
pub fn track_tensors(on: bool) {
    set_tensor_tracking(on);
    if !on {
        tracked().clear();
        forget_graphs();
    }
}

/// One live tensor storage.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveTensor {
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its element type.
    pub dtype: DType,
    /// The bytes its block holds in the allocator.
    pub bytes: u64,
    /// The device it lives on.
    pub device: String,
    /// The op that made it (the innermost frame), or `-` if made outside any.
    pub op: String,
    /// The user's scope it was made in (the outermost frame not made by kiln), or `-`.
    pub scope: String,
    /// Whether a tensor over this storage holds an autograd graph.
    pub holds_graph: bool,
    /// Nodes of the graphs it holds.
    pub graph_nodes: usize,
    /// Bytes of the saved tensors those graphs keep (each storage once).
    pub saved_bytes: u64,
}

/// Tensors made while tracking was on that are still alive, oldest first.
pub fn live_tensors() -> Vec<LiveTensor> {
    let graphs = live_graphs();
    let tensors = tracked();
    tensors
        .iter()
        .filter_map(|e| {
            let storage = e.storage.upgrade()?;
            let held: Vec<&Arc<AutogradMeta>> = graphs
                .iter()
                .filter(|(_, s)| s.as_ptr() == Arc::as_ptr(&storage))
                .map(|(m, _)| m)
                .collect();
            let (mut nodes, mut saved) = (0, 0);
            for m in &held {
                if let Some(node) = &m.grad_fn {
                    let (n, b) = node.graph_size();
                    nodes += n;
                    saved += b;
                }
            }
            let scope = e
                .frames
                .iter()
                .rev()
                .find(|f| !f.filename.starts_with("kiln"))
                .map_or("-".to_string(), |f| f.name.clone());
            Some(LiveTensor {
                shape: e.shape.clone(),
                dtype: e.dtype,
                bytes: storage.block.block_size(),
                device: storage.block.device().spec().to_string(),
                op: e.frames.first().map_or("-".to_string(), |f| f.name.clone()),
                scope,
                holds_graph: !held.is_empty(),
                graph_nodes: nodes,
                saved_bytes: saved,
            })
        })
        .collect()
}

/// Live tensors grouped by (device, op, scope, shape, dtype, graph), largest first, with a hint
/// where a group looks like a usual leak.
pub fn report() -> String {
    #[derive(Default)]
    struct Group {
        count: usize,
        bytes: u64,
        saved: u64,
        nodes: usize,
    }
    let mut groups: BTreeMap<(String, String, String, String, bool), Group> = BTreeMap::new();
    for t in live_tensors() {
        let g = groups
            .entry((
                t.device,
                t.op,
                t.scope,
                format!("{:?} {}", t.shape, t.dtype),
                t.holds_graph,
            ))
            .or_default();
        g.count += 1;
        g.bytes += t.bytes;
        g.saved += t.saved_bytes;
        g.nodes += t.graph_nodes;
    }
    let mut rows: Vec<_> = groups.into_iter().collect();
    rows.sort_by_key(|(_, g)| std::cmp::Reverse(g.bytes + g.saved));
    let mut out = format!(
        "{:>6} {:>12} {:>14}  {:<10} {:<22} {:<18} {}\n",
        "count", "bytes", "graph saves", "device", "op", "scope", "shape"
    );
    let size = |b: u64| crate::alloc::format_size(b);
    for ((device, op, scope, shape, graph), g) in &rows {
        out += &format!(
            "{:>6} {:>12} {:>14}  {:<10} {:<22} {:<18} {}\n",
            g.count,
            size(g.bytes),
            if *graph { size(g.saved) } else { "-".into() },
            device,
            op,
            scope,
            shape
        );
        if *graph && g.count > 1 {
            out += &format!(
                "       ^ {} tensors each keep an autograd graph alive ({} nodes, {} of saved tensors): store .item() or .detach() instead\n",
                g.count,
                g.nodes,
                size(g.saved)
            );
        } else if *graph && g.saved > g.bytes {
            out += &format!(
                "       ^ keeps a graph of {} nodes alive ({} of saved tensors): detach() it if it outlives its step\n",
                g.nodes,
                size(g.saved)
            );
        } else if g.count >= 16 {
            out += &format!(
                "       ^ {} live tensors of the same shape from one place: stored in a loop?\n",
                g.count
            );
        }
    }
    out
}
