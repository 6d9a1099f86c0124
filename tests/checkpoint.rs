//! Training checkpoints: a run interrupted after k steps and resumed from the file in
//! a new process ends with parameters bit-identical to an uninterrupted run, on every adapter
//! and on the CPU device; a file killed mid-overwrite is the old checkpoint or the new one; a
//! truncated or corrupted file is a typed error; a checkpoint that does not fit changes nothing.

use kiln::amp::GradScaler;
use kiln::data::{synthetic_glyphs, DataLoader, LoaderOptions, Resumable};
use kiln::nn::{cross_entropy, state_dict, Dropout, Flatten, Linear, Module, Relu, Sequential};
use kiln::optim::{Adam, Optimizer, Sgd};
use kiln::training::Checkpoint;
use kiln::{DType, Device, Error, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-ckpt-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Everything a training run is: model, optimizer, scaler, loader, on one device.
struct Run {
    device: Device,
    model: Sequential,
    opt: Box<dyn Optimizer>,
    scaler: GradScaler,
    loader: DataLoader<kiln::data::ImageSet>,
}

impl Run {
    /// The run's state before its first step (seeded: every process builds the same one).
    /// Dropout draws from the device generator, the loader shuffles per epoch and the scaler
    /// grows every 3 clean steps, so a resume that missed any of them would diverge.
    fn new(device: &Device, optimizer: &str, hidden: usize) -> Run {
        device.manual_seed(7);
        let model = Sequential::new()
            .push(Flatten)
            .push(Linear::new(28 * 28, hidden, true, device).unwrap())
            .push(Relu)
            .push(Dropout::new(0.2).unwrap())
            .push(Linear::new(hidden, 10, true, device).unwrap());
        let params = model.parameters();
        let opt: Box<dyn Optimizer> = match optimizer {
            "adam" => Box::new(Adam::adamw(params, 1e-3).unwrap()),
            _ => Box::new(
                Sgd::new(params, 0.05)
                    .and_then(|o| o.momentum(0.9))
                    .and_then(|o| o.nesterov(true))
                    .unwrap(),
            ),
        };
        let loader = DataLoader::new(
            Arc::new(synthetic_glyphs(200, 3)),
            device,
            LoaderOptions {
                batch_size: 32,
                shuffle: true,
                drop_last: false,
                ..Default::default()
            },
        )
        .unwrap();
        Run {
            device: device.clone(),
            model,
            opt,
            scaler: GradScaler::with_options(1024.0, 2.0, 0.5, 3, true).unwrap(),
            loader,
        }
    }

    /// Trains until `total` steps have run, starting from step `done`; the step count after.
    fn train(&mut self, mut done: u64, total: u64) -> u64 {
        while done < total {
            let mut batches = self.loader.iter();
            // The count is checked before a batch is taken: a batch taken is a batch the
            // loader's position counts as handed out.
            while done < total {
                let Some(batch) = batches.next() else { break };
                let (x, y) = batch.unwrap();
                let loss = cross_entropy(&self.model.forward(&x).unwrap(), &y).unwrap();
                self.opt.zero_grad(true).unwrap();
                self.scaler.scale(&loss).unwrap().backward().unwrap();
                self.scaler.step(self.opt.as_mut()).unwrap();
                self.scaler.update(None).unwrap();
                done += 1;
            }
        }
        done
    }

    fn checkpoint(&mut self, step: u64) -> Checkpoint<'_> {
        Checkpoint {
            model: state_dict(&self.model),
            optimizer: Some(self.opt.as_mut()),
            scaler: Some(&mut self.scaler),
            loader: Some(&mut self.loader),
            generator: Some(self.device.clone()),
            extra: [("step".to_string(), step.to_string())].into(),
        }
    }

    /// Every parameter's and state tensor's bytes, and the scale: what "bit-identical" compares.
    fn fingerprint(&self) -> Vec<(String, Vec<u8>)> {
        let mut out: Vec<(String, Vec<u8>)> = state_dict(&self.model)
            .into_iter()
            .chain(self.opt.state_tensors())
            .map(|(n, t)| (n, t.to_le_bytes().unwrap()))
            .collect();
        out.push((
            "scale".into(),
            self.scaler.get_scale().to_le_bytes().to_vec(),
        ));
        out
    }
}

const TOTAL_STEPS: u64 = 17; // 7 batches per epoch: the run crosses two epoch boundaries
const INTERRUPT_AT: u64 = 9; // mid-epoch 2

fn write_fingerprint(path: &Path, f: &[(String, Vec<u8>)]) {
    let text: String = f
        .iter()
        .map(|(n, b)| {
            format!(
                "{n} {}\n",
                b.iter().map(|x| format!("{x:02x}")).collect::<String>()
            )
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

/// The child processes' side. `KILN_CHECKPOINT_CHILD` = `{mode} {device} {optimizer} {file}`:
/// `interrupt` trains INTERRUPT_AT steps and saves the checkpoint; `resume` loads it, trains to
/// TOTAL_STEPS and writes the fingerprint to `{file}.out`; `overwrite` rewrites a large
/// checkpoint at `{file}` forever with generations 1, 2, 3, ... (the parent kills it).
#[test]
fn child_process_entry() {
    let Ok(spec) = std::env::var("KILN_CHECKPOINT_CHILD") else {
        return;
    };
    let parts: Vec<&str> = spec.splitn(4, ' ').collect();
    let [mode, device, optimizer, file] = parts[..] else {
        panic!("bad KILN_CHECKPOINT_CHILD {spec:?}");
    };
    let file = Path::new(file);
    if mode == "overwrite" {
        overwrite_forever(file);
    }
    let device = Device::from_spec(device).unwrap();
    let mut run = Run::new(&device, optimizer, 32);
    match mode {
        "interrupt" => {
            let done = run.train(0, INTERRUPT_AT);
            run.checkpoint(done).save(file).unwrap();
        }
        "resume" => {
            let mut ck = run.checkpoint(0);
            ck.load(file).unwrap();
            let done: u64 = ck.extra["step"].parse().unwrap();
            assert_eq!(done, INTERRUPT_AT);
            run.train(done, TOTAL_STEPS);
            write_fingerprint(&file.with_extension("out"), &run.fingerprint());
        }
        _ => panic!("unknown mode {mode}"),
    }
}

fn child(mode: &str, device: &Device, optimizer: &str, file: &Path) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child_process_entry",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(
        "KILN_CHECKPOINT_CHILD",
        format!("{mode} {} {optimizer} {}", device.spec(), file.display()),
    );
    cmd
}

#[test]
fn a_resumed_run_in_a_new_process_is_bit_identical() {
    let dir = scratch("resume");
    for device in kiln::device::test_devices().unwrap() {
        for optimizer in ["sgd", "adam"] {
            let mut reference = Run::new(&device, optimizer, 32);
            reference.train(0, TOTAL_STEPS);
            let expected = reference.fingerprint();

            let file = dir.join(format!(
                "{}-{optimizer}.safetensors",
                device.spec().replace(':', "-")
            ));
            for mode in ["interrupt", "resume"] {
                let out = child(mode, &device, optimizer, &file).output().unwrap();
                assert!(
                    out.status.success(),
                    "{mode} on {} failed:\n{}\n{}",
                    device.name(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let resumed = std::fs::read_to_string(file.with_extension("out")).unwrap();
            let want = file.with_extension("want");
            write_fingerprint(&want, &expected);
            let want_text = std::fs::read_to_string(&want).unwrap();
            assert!(
                resumed == want_text,
                "{optimizer} on {}: the resumed run differs from the uninterrupted one",
                device.name()
            );
            // An uninterrupted run is not trivially equal to a fresh one.
            let fresh = Run::new(&device, optimizer, 32).fingerprint();
            assert_ne!(fresh, expected);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// 16 MiB of tensors, every element `generation`.
fn big_state(generation: u32, device: &Device) -> Vec<(String, Tensor)> {
    (0..4)
        .map(|i| {
            let t = Tensor::full(&[1024, 1024], generation as f64, DType::F32, device).unwrap();
            (format!("layer{i}.weight"), t)
        })
        .collect()
}

fn overwrite_forever(file: &Path) -> ! {
    let cpu = Device::cpu().unwrap();
    for generation in 2.. {
        let ck = Checkpoint {
            model: big_state(generation, &cpu),
            extra: [("generation".to_string(), generation.to_string())].into(),
            ..Default::default()
        };
        ck.save(file).unwrap();
    }
    unreachable!()
}

/// Loads the checkpoint at `file` and checks that it is one whole generation.
fn load_generation(file: &Path) -> kiln::Result<u32> {
    let cpu = Device::cpu().unwrap();
    let model = big_state(0, &cpu);
    let mut ck = Checkpoint {
        model: model.clone(),
        ..Default::default()
    };
    ck.load(file)?;
    let generation: u32 = ck.extra["generation"].parse().unwrap();
    for (name, t) in &model {
        let v = t.to_vec::<f32>().unwrap();
        assert!(
            v.iter().all(|&x| x == generation as f32),
            "{name} is not all {generation}: a torn checkpoint"
        );
    }
    Ok(generation)
}

#[test]
fn a_checkpoint_killed_mid_overwrite_is_the_old_one_or_the_new_one() {
    let dir = scratch("kill");
    let file = dir.join("big.safetensors");
    let cpu = Device::cpu().unwrap();
    Checkpoint {
        model: big_state(1, &cpu),
        extra: [("generation".to_string(), "1".to_string())].into(),
        ..Default::default()
    }
    .save(&file)
    .unwrap();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut generations = Vec::new();
    for _ in 0..24 {
        let mut c = child("overwrite", &cpu, "-", &file)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // A random moment: the child spends most of its time writing the file.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(std::time::Duration::from_millis(30 + seed % 300));
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
        let generation = load_generation(&file).unwrap_or_else(|e| panic!("torn: {e}"));
        generations.push(generation);
        // A killed writer leaves its temporary file; the target is never one of them.
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path != file {
                std::fs::remove_file(path).unwrap();
            }
        }
    }
    eprintln!("kill-during-save: 24 of 24 survived, generations {generations:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn small_checkpoint(dir: &Path) -> (PathBuf, Vec<u8>) {
    let cpu = Device::cpu().unwrap();
    let mut run = Run::new(&cpu, "adam", 4);
    run.train(0, 2);
    let file = dir.join("small.safetensors");
    run.checkpoint(2).save(&file).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    (file, bytes)
}

/// Loads `bytes` as a checkpoint into `run`; a bad file must give an error, not a panic.
fn load_bytes(run: &mut Run, dir: &Path, bytes: &[u8]) -> kiln::Result<()> {
    let file = dir.join("bad.safetensors");
    std::fs::write(&file, bytes).unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run.checkpoint(0).load(&file)
    }));
    result.unwrap_or_else(|_| panic!("loading a corrupted file panicked ({} bytes)", bytes.len()))
}

#[test]
fn truncated_and_corrupted_files_are_typed_errors() {
    let dir = scratch("corrupt");
    let (_, good) = small_checkpoint(&dir);
    // One run takes every bad file: each load must fail and leave it as it was.
    let mut run = Run::new(&Device::cpu().unwrap(), "adam", 4);
    run.train(0, 1);
    let before = run.fingerprint();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;

    // Cut at every byte of the header and at 200 places in the data.
    let data_len = good.len() - 8 - header_len;
    let cuts = (0..8 + header_len).chain((0..200).map(|i| 8 + header_len + i * data_len / 200));
    for cut in cuts {
        let e = load_bytes(&mut run, &dir, &good[..cut]).expect_err("a truncated file loaded");
        assert!(matches!(e, Error::InvalidFile { .. }), "cut {cut}: {e}");
    }
    // Every header byte flipped (the 8-byte length and the JSON).
    for i in 0..8 + header_len {
        let mut bad = good.clone();
        bad[i] ^= 0xFF;
        let e = load_bytes(&mut run, &dir, &bad).expect_err("a corrupted header loaded");
        assert!(matches!(e, Error::InvalidFile { .. }), "byte {i}: {e}");
    }
    // Hand-made headers: a shape that does not match the data, an unknown dtype, a dtype kiln
    // lacks, sizes that claim terabytes or overflow, a header length of 2^60.
    let file_of = |header: &str, data: usize| {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend(header.as_bytes());
        v.extend(std::iter::repeat_n(0u8, data));
        v
    };
    let cases = [
        (
            r#"{"t":{"dtype":"F32","shape":[3,3],"data_offsets":[0,16]}}"#,
            16,
        ),
        (
            r#"{"t":{"dtype":"X99","shape":[2],"data_offsets":[0,8]}}"#,
            8,
        ),
        (
            r#"{"t":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}}"#,
            8,
        ),
        (
            r#"{"t":{"dtype":"F32","shape":[1099511627776,1024],"data_offsets":[0,16]}}"#,
            16,
        ),
        (
            r#"{"t":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,16]}}"#,
            16,
        ),
        (
            r#"{"t":{"dtype":"F32","shape":[4],"data_offsets":[0,4398046511104]}}"#,
            16,
        ),
    ];
    for (header, data) in cases {
        let e = load_bytes(&mut run, &dir, &file_of(header, data)).expect_err(header);
        assert!(matches!(e, Error::InvalidFile { .. }), "{header}: {e}");
    }
    let mut huge = (1u64 << 60).to_le_bytes().to_vec();
    huge.extend(b"{}");
    let e = load_bytes(&mut run, &dir, &huge).unwrap_err();
    assert!(matches!(e, Error::InvalidFile { .. }), "{e}");
    assert!(run.fingerprint() == before, "a failed load changed the run");
    // The good file still loads into it.
    load_bytes(&mut run, &dir, &good).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_checkpoint_that_does_not_fit_changes_nothing() {
    let dir = scratch("nofit");
    let cpu = Device::cpu().unwrap();
    for device in kiln::device::test_devices().unwrap() {
        // Saved from a run with 4 hidden units; loaded into one with 8, then into one whose
        // optimizer is SGD: each load fails naming the key, and nothing changed.
        let mut small = Run::new(&cpu, "adam", 4);
        small.train(0, 3);
        let file = dir.join("ck.safetensors");
        small.checkpoint(3).save(&file).unwrap();
        for (optimizer, hidden, needle) in [
            ("adam", 8, "model.1.weight"),
            ("sgd", 4, "the state dict is of a AdamW optimizer"),
        ] {
            let mut run = Run::new(&device, optimizer, hidden);
            run.train(0, 2);
            let before = run.fingerprint();
            let rng = device.get_rng_state();
            let loader = run.loader.loader_state();
            let e = run.checkpoint(0).load(&file).unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
            assert!(
                run.fingerprint() == before,
                "{}: a failed load changed the run",
                device.name()
            );
            assert_eq!(device.get_rng_state(), rng);
            assert_eq!(run.loader.loader_state(), loader);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn optimizer_state_dicts_round_trip_with_param_groups() {
    let cpu = Device::cpu().unwrap();
    let mut run = Run::new(&cpu, "adam", 4);
    run.train(0, 3);
    let sd = run.opt.state_dict();
    assert_eq!(sd.metadata["type"], "AdamW");
    assert_eq!(sd.metadata["param_groups.0.lr"], "0.001");
    assert_eq!(sd.metadata["param_groups.0.betas"], "[0.9, 0.999]");
    assert_eq!(sd.metadata["param_groups.0.weight_decay"], "0.01");
    assert_eq!(sd.metadata["param_groups.0.params"], "[0, 1, 2, 3]");
    let names: Vec<&str> = sd.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"state.3.exp_avg_sq"), "{names:?}");

    // Into a fresh optimizer with other hyperparameters: PyTorch restores the saved ones.
    let params = run.model.parameters();
    let mut other = Adam::adamw(params, 0.5).unwrap();
    other.load_state_dict(&sd).unwrap();
    assert_eq!(other.lr, 1e-3);
    let again = other.state_dict();
    assert_eq!(again.metadata, sd.metadata);
    for ((n, a), (m, b)) in sd.tensors.iter().zip(&again.tensors) {
        assert_eq!(n, m);
        assert_eq!(a.to_le_bytes().unwrap(), b.to_le_bytes().unwrap(), "{n}");
    }

    // Bad hyperparameters in a file are refused like bad ones at construction.
    let mut bad = sd.clone();
    bad.metadata
        .insert("param_groups.0.lr".into(), "-1.0".into());
    let e = other.load_state_dict(&bad).unwrap_err();
    assert!(e.to_string().contains("Invalid learning rate: -1.0"), "{e}");
    assert_eq!(other.lr, 1e-3);
}
