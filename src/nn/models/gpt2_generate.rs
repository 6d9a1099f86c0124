//! Generation from a GPT-2: a key/value cache allocated once for the whole sequence (every
//! block's keys and values `[B, H, T_max, D]`, written in place as tokens arrive, so no step
//! allocates or copies the past again) and temperature / top-k sampling whose uniform draws
//! come from the device generator (`manual_seed` makes a generation repeat). The last
//! position's logits are read back each step and the choice is made on the host, as one row
//! of `vocab` floats is small beside a step.

use super::gpt2::{CacheSlot, Gpt};
use crate::tensor::{DType, Tensor};
use crate::{Device, Error, Result};

/// Every block's keys and values for up to `capacity` positions of a batch.
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// A cache for `batch` sequences of up to `capacity` positions, in `dtype`, allocated now.
    pub fn new(
        model: &Gpt,
        batch: usize,
        capacity: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<KvCache> {
        let c = &model.config;
        if capacity > c.block_size || capacity == 0 || batch == 0 {
            return Err(Error::InvalidArgument {
                op: "KvCache",
                msg: format!(
                    "capacity {capacity} for batch {batch} (the model's block size is {})",
                    c.block_size
                ),
            });
        }
        let shape = [batch, c.n_head, capacity, c.head_dim()];
        let make = || Tensor::zeros(&shape, dtype, device);
        let k = (0..c.n_layer).map(|_| make()).collect::<Result<_>>()?;
        let v = (0..c.n_layer).map(|_| make()).collect::<Result<_>>()?;
        Ok(KvCache {
            k,
            v,
            len: 0,
            capacity,
        })
    }

    /// Device bytes the cache holds (keys and values of every block).
    pub fn bytes(&self) -> u64 {
        self.k
            .iter()
            .chain(&self.v)
            .map(|t| (t.numel() * t.dtype().size_bytes()) as u64)
            .sum()
    }

    /// Positions written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most positions it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// How `generate` picks each token: the most likely one at `temperature` 0, else a draw from
/// the softmax of the logits over `temperature`, among the `top_k` most likely where given.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits; 0 picks the most likely token (greedy).
    pub temperature: f64,
    /// Only the k most likely tokens may be drawn (ties at the k-th value included).
    pub top_k: Option<usize>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 1.0,
            top_k: None,
        }
    }
}

impl Gpt {
    /// Logits `[B, T, vocab]` of new tokens `ids` (`[B, T]`) that follow the cache's
    /// positions, whose keys and values are appended to the cache.
    pub fn forward_cached(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let t = ids.shape().get(1).copied().unwrap_or(0);
        if cache.len + t > cache.capacity
            || ids.shape().first() != cache.k.first().map(|k| &k.shape()[0])
        {
            return Err(Error::InvalidArgument {
                op: "forward_cached",
                msg: format!(
                    "{} new positions of shape {:?} after {} of a cache for {} (batch {:?})",
                    t,
                    ids.shape(),
                    cache.len,
                    cache.capacity,
                    cache.k.first().map(|k| k.shape()[0])
                ),
            });
        }
        let mut x = self.embed(ids, cache.len)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let slot = CacheSlot {
                k: &cache.k[i],
                v: &cache.v[i],
                pos: cache.len,
            };
            x = block.forward_cached(&x, Some(slot))?;
        }
        cache.len += t;
        self.head(&x)
    }

    /// Continues each row of `prompt` (i32 `[B, T0]`) by `max_new_tokens` tokens, without
    /// gradients, through one cache allocated for `T0 + max_new_tokens` positions; returns the
    /// ids `[B, T0 + max_new_tokens]` and the cache (its `bytes()` is what it held).
    pub fn generate(
        &self,
        prompt: &Tensor,
        max_new_tokens: usize,
        sampling: &Sampling,
    ) -> Result<(Tensor, KvCache)> {
        if prompt.rank() != 2 || prompt.dtype() != DType::I32 || prompt.numel() == 0 {
            return Err(Error::InvalidArgument {
                op: "generate",
                msg: format!(
                    "expected i32 token ids [B, T], got shape {:?}",
                    prompt.shape()
                ),
            });
        }
        if sampling.temperature.is_nan() || sampling.temperature < 0.0 || sampling.top_k == Some(0)
        {
            return Err(Error::InvalidArgument {
                op: "generate",
                msg: format!("{sampling:?}: temperature >= 0 and top_k >= 1 where given"),
            });
        }
        let (b, t0) = (prompt.shape()[0], prompt.shape()[1]);
        let device = prompt.device();
        let dtype = self.wte.weight.dtype();
        let mut cache = KvCache::new(self, b, t0 + max_new_tokens, dtype, device)?;
        let mut rows: Vec<Vec<i32>> = prompt
            .to_vec::<i32>()?
            .chunks(t0)
            .map(|r| r.to_vec())
            .collect();
        crate::no_grad(|| -> Result<()> {
            let mut logits = self.forward_cached(prompt, &mut cache)?;
            for step in 0..max_new_tokens {
                let t = logits.shape()[1];
                let last = logits.narrow(1, t - 1, 1)?;
                let next = sample(&last, sampling, device)?;
                for (row, &id) in rows.iter_mut().zip(&next) {
                    row.push(id);
                }
                if step + 1 < max_new_tokens {
                    let ids = Tensor::from_slice(&next, &[b, 1], device)?;
                    logits = self.forward_cached(&ids, &mut cache)?;
                }
            }
            Ok(())
        })?;
        let flat: Vec<i32> = rows.concat();
        let out = Tensor::from_slice(&flat, &[b, t0 + max_new_tokens], device)?;
        Ok((out, cache))
    }
}

/// One token per row of logits `[B, 1, vocab]`.
fn sample(logits: &Tensor, sampling: &Sampling, device: &Device) -> Result<Vec<i32>> {
    let vocab = *logits.shape().last().unwrap_or(&1);
    let values = logits.to_dtype(DType::F32)?.to_vec::<f32>()?;
    let b = values.len() / vocab.max(1);
    let greedy = sampling.temperature == 0.0;
    let uniforms = match greedy {
        true => vec![0.0; b],
        false => Tensor::rand(&[b], DType::F32, device)?.to_vec::<f32>()?,
    };
    Ok(values
        .chunks(vocab)
        .zip(uniforms)
        .map(|(row, u)| pick(row, sampling, u) as i32)
        .collect())
}

/// The token a row of logits gives for the uniform draw `u` in [0, 1).
pub(crate) fn pick(row: &[f32], sampling: &Sampling, u: f32) -> usize {
    let argmax = || {
        row.iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
                if x > best.1 {
                    (i, x)
                } else {
                    best
                }
            })
            .0
    };
    if sampling.temperature == 0.0 {
        return argmax();
    }
    let threshold = match sampling.top_k {
        Some(k) if k < row.len() => {
            let mut sorted = row.to_vec();
            let (_, kth, _) = sorted.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
            *kth
        }
        _ => f32::NEG_INFINITY,
    };
    let max = row[argmax()];
    let inv_t = 1.0 / sampling.temperature;
    let weights: Vec<f64> = row
        .iter()
        .map(|&x| match x >= threshold {
            true => (((x - max) as f64) * inv_t).exp(),
            false => 0.0,
        })
        .collect();
    let total: f64 = weights.iter().sum();
    let target = u as f64 * total;
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if acc > target && *w > 0.0 {
            return i;
        }
    }
    argmax()
}
