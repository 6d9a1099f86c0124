//! `kiln::debug`: live tensors with the op and scope that made them, and the graphs that stored
//! results keep alive (one test: tracking is process-wide).

use kiln::nn::{cross_entropy, Linear, Module};
use kiln::profiler::record_function;
use kiln::{DType, Device, Tensor};

#[test]
fn stored_losses_show_their_graphs_and_detached_ones_do_not() {
    let dev = Device::cpu().unwrap();
    let model = Linear::new(32, 8, true, &dev).unwrap();
    let x = Tensor::randn(&[16, 32], DType::F32, &dev).unwrap();
    let y = Tensor::from_slice(&[0i32; 16], &[16], &dev).unwrap();
    kiln::debug::track_tensors(true);
    let mut stored = Vec::new();
    for _ in 0..3 {
        stored.push(
            record_function("## eval ##", || cross_entropy(&model.forward(&x)?, &y)).unwrap(),
        );
    }
    let live = kiln::debug::live_tensors();
    let losses: Vec<_> = live
        .iter()
        .filter(|t| t.holds_graph && t.scope == "## eval ##" && t.shape.is_empty())
        .collect();
    assert_eq!(losses.len(), 3, "{live:#?}");
    for l in &losses {
        // The graph saves at least the input batch and the weight (16x32 + 8x32 f32).
        assert!(l.saved_bytes >= (16 * 32 + 8 * 32) * 4, "{l:?}");
        assert!(l.graph_nodes >= 3);
        assert_eq!(l.device, "cpu");
    }
    // The activations the graphs save are listed too, made by their ops in the user's scope.
    assert!(live
        .iter()
        .any(|t| t.scope == "## eval ##" && t.shape == vec![16, 8] && !t.holds_graph));
    let report = kiln::debug::report();
    assert!(
        report.contains("3 tensors each keep an autograd graph alive"),
        "{report}"
    );
    // Detached losses hold no graph; once dropped, the graphs' tensors are gone.
    let detached: Vec<Tensor> = stored.iter().map(Tensor::detach).collect();
    drop(stored);
    let live = kiln::debug::live_tensors();
    assert!(live.iter().all(|t| !t.holds_graph), "{live:#?}");
    assert!(!live.iter().any(|t| t.shape == vec![16, 8]));
    assert_eq!(detached.len(), 3);
    kiln::debug::track_tensors(false);
    assert!(kiln::debug::live_tensors().is_empty());
}
