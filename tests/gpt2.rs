//! GPT-2 (`nn::models::gpt2`): the preset's parameter count and checkpoint names, a Hugging
//! Face-style checkpoint (BF16, no `transformer.` prefix, Conv1D weights `[in, out]`, mask
//! buffers) loaded by name, every adapter against the CPU device (logits, loss, gradients,
//! checkpointed blocks), learning under AdamW, and generation through the key/value cache
//! against recomputing the whole sequence.

use kiln::nn::models::{gpt2, Gpt, GptConfig, Sampling};
use kiln::nn::{load_state_dict, state_dict, Module};
use kiln::optim::{Adam, Optimizer};
use kiln::{DType, Device, Error, Tensor};

fn devices() -> Vec<Device> {
    kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
}

fn tiny() -> GptConfig {
    GptConfig {
        block_size: 16,
        n_embd: 32,
        ..GptConfig::tiny(40)
    }
}

/// A model on `dev` holding `like`'s parameters (made on the CPU device).
fn copy_to(like: &Gpt, dev: &Device) -> Gpt {
    let mut m = gpt2(like.config.clone(), dev).unwrap();
    load_state_dict(&mut m, &state_dict(like)).unwrap();
    m
}

fn ids(b: usize, t: usize, seed: i32, vocab: usize, dev: &Device) -> Tensor {
    let v: Vec<i32> = (0..b * t)
        .map(|i| ((i as i32 * 7 + seed * 13) % vocab as i32).abs())
        .collect();
    Tensor::from_slice(&v, &[b, t], dev).unwrap()
}

fn host(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

fn max_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f32::max)
}

#[test]
fn the_gpt2_preset_has_the_checkpoints_names_and_count() {
    // On the CPU device: the f32 token embeddings (147 MiB) are larger than one storage
    // binding of lavapipe (128 MiB); GPUs bind them whole.
    let m = gpt2(GptConfig::gpt2(), &Device::cpu().unwrap()).unwrap();
    assert_eq!(m.num_parameters(), 124_439_808);
    let named = m.named_parameters();
    let shape = |n: &str| {
        named
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, t)| t.shape().to_vec())
            .unwrap_or_else(|| panic!("no {n}"))
    };
    assert_eq!(shape("transformer.wte.weight"), [50257, 768]);
    assert_eq!(shape("transformer.wpe.weight"), [1024, 768]);
    assert_eq!(shape("transformer.h.0.attn.c_attn.weight"), [768, 2304]);
    assert_eq!(shape("transformer.h.11.mlp.c_proj.weight"), [3072, 768]);
    assert_eq!(shape("transformer.h.5.ln_2.bias"), [768]);
    assert_eq!(shape("transformer.ln_f.weight"), [768]);
    assert_eq!(named.len(), 2 + 12 * 12 + 2);
    // nanoGPT's initialisation: residual projections at 0.02 / sqrt(2 * 12).
    let w = host(&m.named_parameters()[2 + 4].1);
    let std = (w.iter().map(|x| x * x).sum::<f32>() / w.len() as f32).sqrt();
    assert!((std - 0.02 / 24f32.sqrt()).abs() < 2e-4, "{std}");
}

#[test]
fn a_hugging_face_style_bf16_checkpoint_loads_by_name() {
    use safetensors::tensor::{Dtype, TensorView};
    let cpu = Device::cpu().unwrap();
    let src = gpt2(tiny(), &cpu).unwrap();
    // Hugging Face's GPT2LMHeadModel file: names without `transformer.`, a stored lm_head,
    // the attention's mask buffers, every float in BF16 (rounded from kiln's f32 values).
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>, Dtype)> = Vec::new();
    for (name, t) in state_dict(&src) {
        let bf16: Vec<u8> = host(&t)
            .iter()
            .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let short = name.trim_start_matches("transformer.").to_string();
        owned.push((short, t.shape().to_vec(), bf16, Dtype::BF16));
    }
    let wte = owned[0].clone();
    owned.push(("lm_head.weight".into(), wte.1, wte.2, Dtype::BF16));
    owned.push((
        "h.0.attn.bias".into(),
        vec![1, 1, 16, 16],
        vec![0; 256],
        Dtype::U8,
    ));
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, s, b, d)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let dir = std::env::temp_dir().join(format!("kiln-gpt2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path).unwrap();

    for dev in devices() {
        let mut m = gpt2(tiny(), &dev).unwrap();
        m.load_safetensors(&path).unwrap();
        for ((n, got), (_, want)) in m.named_parameters().iter().zip(src.named_parameters()) {
            let want: Vec<f32> = host(&want)
                .iter()
                .map(|x| f32::from_bits(x.to_bits() & 0xffff_0000))
                .collect();
            assert_eq!(host(got), want, "{dev:?} {n}");
        }
        // A checkpoint of another shape is refused and leaves the model as it was.
        let before = host(&m.wte.weight);
        let mut wide = gpt2(
            GptConfig {
                n_embd: 64,
                ..tiny()
            },
            &dev,
        )
        .unwrap();
        let e = wide.load_safetensors(&path).unwrap_err();
        assert!(e.to_string().contains("size mismatch"), "{e}");
        assert_eq!(host(&m.wte.weight), before);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_adapter_matches_the_cpu_device() {
    let cpu = Device::cpu().unwrap();
    let reference = gpt2(tiny(), &cpu).unwrap();
    let (x, y) = (ids(2, 16, 1, 40, &cpu), ids(2, 16, 2, 40, &cpu));
    let want_loss = reference.loss(&x, &y).unwrap();
    want_loss.backward().unwrap();
    let want: Vec<(String, Vec<f32>)> = reference
        .named_parameters()
        .iter()
        .map(|(n, p)| (n.clone(), host(&p.grad().unwrap())))
        .collect();
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        for checkpoint in [false, true] {
            let mut m = copy_to(&reference, &dev);
            m.checkpoint_blocks = checkpoint;
            let (xd, yd) = (ids(2, 16, 1, 40, &dev), ids(2, 16, 2, 40, &dev));
            let logits = m.forward(&xd).unwrap();
            let want_logits = reference.forward(&x).unwrap();
            assert!(
                max_err(&host(&logits), &host(&want_logits)) < 1e-4,
                "{dev:?}"
            );
            let loss = m.loss(&xd, &yd).unwrap();
            let (l, wl) = (host(&loss)[0], host(&want_loss)[0]);
            assert!((l - wl).abs() < 1e-4, "{dev:?} loss {l} vs {wl}");
            loss.backward().unwrap();
            for ((n, p), (_, w)) in m.named_parameters().iter().zip(&want) {
                let e = max_err(&host(&p.grad().unwrap()), w);
                assert!(e < 2e-4, "{dev:?} checkpoint {checkpoint} {n}: {e}");
            }
        }
    }
}

#[test]
fn adamw_steps_lower_the_loss() {
    for dev in devices() {
        dev.manual_seed(0);
        let m = gpt2(tiny(), &dev).unwrap();
        let mut opt = Adam::adamw(m.parameters(), 3e-3).unwrap();
        let (x, y) = (ids(4, 16, 3, 40, &dev), ids(4, 16, 4, 40, &dev));
        let first = host(&m.loss(&x, &y).unwrap())[0];
        // Untrained: about ln(40).
        assert!((first - 40f32.ln()).abs() < 0.3, "{dev:?} {first}");
        let mut last = first;
        for _ in 0..30 {
            opt.zero_grad(true).unwrap();
            let loss = m.loss(&x, &y).unwrap();
            loss.backward().unwrap();
            opt.step().unwrap();
            last = host(&loss)[0];
        }
        assert!(last < 0.5 * first, "{dev:?}: {first} -> {last}");
    }
}

#[test]
fn cached_generation_matches_recomputing_the_sequence() {
    let cpu = Device::cpu().unwrap();
    let reference = gpt2(tiny(), &cpu).unwrap();
    for dev in devices() {
        let mut m = copy_to(&reference, &dev);
        m.eval();
        let prompt = ids(2, 5, 6, 40, &dev);
        let greedy = Sampling {
            temperature: 0.0,
            top_k: None,
        };
        let (out, cache) = m.generate(&prompt, 8, &greedy).unwrap();
        assert_eq!(out.shape(), &[2, 13]);
        // Keys and values of 2 layers, batch 2, 2 heads, 13 positions, 16 wide, f32.
        assert_eq!(cache.bytes(), 2 * 2 * (2 * 2 * 13 * 16) * 4);
        assert_eq!(cache.len(), 12);
        // Recomputed without a cache: each next token is the argmax of the full forward.
        let got = out.to_vec::<i32>().unwrap();
        let mut seq: Vec<Vec<i32>> = got.chunks(13).map(|r| r[..5].to_vec()).collect();
        for step in 0..8 {
            let t = 5 + step;
            let flat: Vec<i32> = seq.concat();
            let x = Tensor::from_slice(&flat, &[2, t], &dev).unwrap();
            let logits = kiln::no_grad(|| m.forward(&x)).unwrap();
            let last = host(&logits.narrow(1, t - 1, 1).unwrap());
            for (r, row) in last.chunks(40).enumerate() {
                let best = (0..40).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
                seq[r].push(best as i32);
            }
        }
        assert_eq!(seq.concat(), got, "{dev:?}");
        // top_k = 1 is greedy whatever the temperature; a seeded draw repeats.
        let top1 = Sampling {
            temperature: 0.8,
            top_k: Some(1),
        };
        let (again, _) = m.generate(&prompt, 8, &top1).unwrap();
        assert_eq!(again.to_vec::<i32>().unwrap(), got);
        let warm = Sampling {
            temperature: 1.0,
            top_k: Some(10),
        };
        dev.manual_seed(3);
        let (a, _) = m.generate(&prompt, 6, &warm).unwrap();
        dev.manual_seed(3);
        let (b, _) = m.generate(&prompt, 6, &warm).unwrap();
        assert_eq!(a.to_vec::<i32>().unwrap(), b.to_vec::<i32>().unwrap());
    }
}

#[test]
fn bad_inputs_get_typed_errors() {
    for dev in devices() {
        let m = gpt2(tiny(), &dev).unwrap();
        let before = dev.memory_allocated();
        let long = ids(1, 17, 0, 40, &dev);
        let floats = Tensor::zeros(&[1, 4], DType::F32, &dev).unwrap();
        for (what, r) in [
            ("too long", m.forward(&long)),
            ("f32 ids", m.forward(&floats)),
            (
                "generate past the block",
                m.generate(&ids(1, 10, 0, 40, &dev), 7, &Sampling::default())
                    .map(|r| r.0),
            ),
        ] {
            assert!(
                matches!(r, Err(Error::InvalidArgument { .. })),
                "{dev:?} {what}: {:?}",
                r.map(|t| t.shape().to_vec())
            );
        }
        assert!(gpt2(
            GptConfig {
                n_head: 3,
                ..tiny()
            },
            &dev
        )
        .is_err());
        drop(long);
        drop(floats);
        assert!(dev.memory_allocated() <= before, "{dev:?}");
    }
}

/// The `gpt` example's loop (AdamW with weight decay 0.1, gradients clipped at norm 1) for a few
/// steps from the same weights and batches: every adapter's losses follow the CPU device's.
#[test]
fn training_steps_follow_the_cpu_device() {
    let cpu = Device::cpu().unwrap();
    let reference = gpt2(tiny(), &cpu).unwrap();
    let losses = |m: &Gpt, dev: &Device| -> Vec<f32> {
        let mut opt = Adam::adamw(m.parameters(), 1e-2).unwrap();
        opt.weight_decay = 0.1;
        (0..5)
            .map(|step| {
                let (x, y) = (ids(4, 12, step, 40, dev), ids(4, 12, step + 9, 40, dev));
                opt.zero_grad(true).unwrap();
                let loss = m.loss(&x, &y).unwrap();
                loss.backward().unwrap();
                kiln::nn::clip_grad_norm_(&m.parameters(), 1.0, 2.0).unwrap();
                opt.step().unwrap();
                host(&loss)[0]
            })
            .collect()
    };
    let want = losses(&copy_to(&reference, &cpu), &cpu);
    assert!(want[4] < want[0], "{want:?}");
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        let got = losses(&copy_to(&reference, &dev), &dev);
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() < 1e-3 * (1.0 + w.abs()),
                "{dev:?}: {got:?} vs {want:?}"
            );
        }
    }
}
