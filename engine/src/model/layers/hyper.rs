//! Manifold-constrained hyper-connections (DeepSeek-V4): the residual
//! stream is `N` streams wide (`hc_mult`, 4 in V4-Flash). Before each
//! attention and feed-forward block the streams are weighed into one input
//! (`pre`); the block's output is spread back over them (`post`) and the
//! streams are mixed by a matrix made doubly stochastic by Sinkhorn
//! normalisation (`comb`). All of it is computed per position in f32, in a
//! fixed order, so a row's result never depends on the rows beside it.

use super::{Linear, values};
use crate::kernels::math::{exp, sigmoid};
use crate::kernels::ops::rms_norm;
use crate::model::ModelError;
use crate::weights::Weights;

/// The mixing weights one block's hyper-connection derives for each row.
pub struct Mixing {
    /// `[rows][N]`: how much of the block's output each stream takes.
    post: Vec<f32>,
    /// `[rows][N][N]`: `comb[j][k]` is stream `j`'s share in new stream `k`.
    comb: Vec<f32>,
}

/// The settings every hyper-connection of a model shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HyperShape {
    pub streams: usize,
    pub hidden: usize,
    /// The unweighted RMS norm's epsilon (`rms_norm_eps`).
    pub norm_eps: f64,
    /// Added to `pre`, to the softmax and to every Sinkhorn denominator.
    pub eps: f32,
    pub sinkhorn_iters: usize,
}

/// One block's hyper-connection: `fn` `[(2 + N)·N, N·D]`, `base`, `scale [3]`.
pub struct HyperConnection {
    mix: Linear,
    base: Vec<f32>,
    scale: Vec<f32>,
    shape: HyperShape,
}

/// `x / rms(x)` over each row of `width`.
fn unweighted_norm(x: &[f32], width: usize, eps: f64) -> Vec<f32> {
    rms_norm(x, &vec![1.0; width], eps as f32)
}

impl HyperConnection {
    /// Loads `{name}.fn`, `{name}.base` and `{name}.scale` under `w`.
    pub fn load(w: &Weights, name: &str, shape: &HyperShape) -> Result<Self, ModelError> {
        let n = shape.streams;
        let width = (2 + n) * n;
        Ok(Self {
            mix: Linear::from_matrix(w.matrix(&format!("{name}.fn"), width, n * shape.hidden)?),
            base: values(&w.get(&format!("{name}.base"), &[width])?)?,
            scale: values(&w.get(&format!("{name}.scale"), &[3])?)?,
            shape: *shape,
        })
    }

    /// The block's input for each of the `rows` rows of `h` (`[rows][N][D]`)
    /// and the weights that [`HyperConnection::spread`] uses after it.
    pub fn collapse(&self, h: &[f32], rows: usize) -> Result<(Vec<f32>, Mixing), ModelError> {
        let (n, d) = (self.shape.streams, self.shape.hidden);
        let eps = self.shape.eps;
        let normed = unweighted_norm(h, n * d, self.shape.norm_eps);
        let mix = self.mix.forward_values(&normed, rows)?;
        let (base, scale) = (&self.base, &self.scale);
        let mut collapsed = Vec::with_capacity(rows * d);
        let mut post = Vec::with_capacity(rows * n);
        let mut comb = Vec::with_capacity(rows * n * n);
        for (r, m) in mix.chunks_exact((2 + n) * n).enumerate() {
            let pre: Vec<f32> = (0..n)
                .map(|j| sigmoid(m[j] * scale[0] + base[j]) + eps)
                .collect();
            post.extend((0..n).map(|j| 2.0 * sigmoid(m[n + j] * scale[1] + base[n + j])));
            comb.extend(self.sinkhorn(&m[2 * n..], &base[2 * n..]));
            let streams = &h[r * n * d..(r + 1) * n * d];
            collapsed.extend(weigh(streams, &pre, d));
        }
        Ok((collapsed, Mixing { post, comb }))
    }

    /// `softmax(logits · scale + base)` per row of the `N × N` matrix, then
    /// columns and rows normalised in turn (`eps` in every denominator):
    /// one column pass, then `iters − 1` row-and-column passes.
    fn sinkhorn(&self, logits: &[f32], base: &[f32]) -> Vec<f32> {
        let n = self.shape.streams;
        let eps = self.shape.eps;
        let mut c: Vec<f32> = logits
            .iter()
            .zip(base)
            .map(|(l, b)| l * self.scale[2] + b)
            .collect();
        for row in c.chunks_exact_mut(n) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            row.iter_mut().for_each(|v| *v = exp(*v - max));
            let sum: f32 = row.iter().sum();
            row.iter_mut().for_each(|v| *v = *v / sum + eps);
        }
        let columns = |c: &mut Vec<f32>| {
            for k in 0..n {
                let sum: f32 = (0..n).map(|j| c[j * n + k]).sum::<f32>() + eps;
                (0..n).for_each(|j| c[j * n + k] /= sum);
            }
        };
        columns(&mut c);
        for _ in 1..self.shape.sinkhorn_iters {
            for row in c.chunks_exact_mut(n) {
                let sum: f32 = row.iter().sum::<f32>() + eps;
                row.iter_mut().for_each(|v| *v /= sum);
            }
            columns(&mut c);
        }
        c
    }

    /// The streams after a block: new stream `k` is `post[k] · y +
    /// Σ_j comb[j][k] · h[j]`, for `h` `[rows][N][D]` and the block's output
    /// `y` `[rows][D]`.
    pub fn spread(&self, mixing: &Mixing, h: &[f32], y: &[f32]) -> Vec<f32> {
        let (n, d) = (self.shape.streams, self.shape.hidden);
        let mut out = vec![0f32; h.len()];
        let rows = out.chunks_exact_mut(n * d).zip(h.chunks_exact(n * d));
        for (r, (o, streams)) in rows.enumerate() {
            let post = &mixing.post[r * n..(r + 1) * n];
            let comb = &mixing.comb[r * n * n..(r + 1) * n * n];
            let y = &y[r * d..(r + 1) * d];
            for (k, ok) in o.chunks_exact_mut(d).enumerate() {
                for (c, v) in ok.iter_mut().enumerate() {
                    let mixed: f32 = (0..n).map(|j| comb[j * n + k] * streams[j * d + c]).sum();
                    *v = post[k] * y[c] + mixed;
                }
            }
        }
        out
    }
}

/// `Σ_j pre[j] · stream j`, over streams in order.
fn weigh(streams: &[f32], pre: &[f32], d: usize) -> Vec<f32> {
    (0..d)
        .map(|c| {
            pre.iter()
                .enumerate()
                .map(|(j, p)| p * streams[j * d + c])
                .sum()
        })
        .collect()
}

/// The last collapse of the streams into one, before the final norm.
pub enum HyperHead {
    /// DeepSeek-V4's, weighed like a block's input: `hc_fn [N, N·D]`,
    /// `hc_base [N]`, `hc_scale [1]`.
    Weighted {
        mix: Linear,
        base: Vec<f32>,
        scale: f32,
        shape: HyperShape,
    },
    /// GLM-5.3's unweighted mean of the streams.
    Mean(HyperShape),
}

impl HyperHead {
    /// Loads `hc_fn`, `hc_base` and `hc_scale` under `w`.
    pub fn load(w: &Weights, shape: &HyperShape) -> Result<Self, ModelError> {
        let n = shape.streams;
        Ok(Self::Weighted {
            mix: Linear::from_matrix(w.matrix("hc_fn", n, n * shape.hidden)?),
            base: values(&w.get("hc_base", &[n])?)?,
            scale: values(&w.get("hc_scale", &[1])?)?[0],
            shape: *shape,
        })
    }

    /// The `rows` rows of `h` (`[rows][N][D]`) as one stream `[rows][D]`.
    pub fn collapse(&self, h: &[f32], rows: usize) -> Result<Vec<f32>, ModelError> {
        let (mix, base, scale, shape) = match self {
            Self::Weighted {
                mix,
                base,
                scale,
                shape,
            } => (mix, base, *scale, shape),
            Self::Mean(shape) => {
                let (n, d) = (shape.streams, shape.hidden);
                let ones = vec![1.0; n];
                // The reference sums the streams, then divides by their number.
                return Ok(h
                    .chunks_exact((n * d).max(1))
                    .take(rows)
                    .flat_map(|r| weigh(r, &ones, d))
                    .map(|v| v / n as f32)
                    .collect());
            }
        };
        let (n, d) = (shape.streams, shape.hidden);
        let normed = unweighted_norm(h, n * d, shape.norm_eps);
        let mix = mix.forward_values(&normed, rows)?;
        let mut out = Vec::with_capacity(rows * d);
        for (r, m) in mix.chunks_exact(n).enumerate() {
            let pre: Vec<f32> = m
                .iter()
                .zip(base)
                .map(|(v, b)| sigmoid(v * scale + b) + shape.eps)
                .collect();
            out.extend(weigh(&h[r * n * d..(r + 1) * n * d], &pre, d));
        }
        Ok(out)
    }
}
