//! Linear attention with the gated delta rule: Kimi Delta Attention (KDA,
//! Kimi-Linear and the K3 line) and Gated DeltaNet (Qwen3-Next, Qwen3.5).
//!
//! Each layer keeps a `[value head][key dim][value dim]` state and the
//! short convolution's last inputs instead of a growing cache. Per
//! position: convolve q/k/v over the window, normalise q and k, decay the
//! state (one factor per head in Gated DeltaNet, one per key channel in
//! KDA), write the value's correction along the key (`β`), read with the
//! query, then a gated norm and the output projection.
//!
//! Only the recurrent form is computed, one position after another, for
//! prompts as for decoding. The reference's chunked form for prompts sums
//! in another order, so a prompt fed in one pass would differ in its last
//! bits from the same tokens fed one by one — and speculative verification,
//! resume and `truncate` all rely on a row's result not depending on the
//! rows fed with it. On a CPU the recurrent form costs `4·dk·dv` multiply-adds
//! per head and position, under a tenth of the layer's projections at
//! Kimi-Linear's shape (32 heads of 128: 2.1 M against 39 M), so the chunked
//! form would save little here.

use candle_core::{Device, Tensor};

use super::{Linear, RmsNorm, Stacked, values};
use crate::kernels::math::{exp, sigmoid, silu, softplus};
use crate::model::{ModelError, SequenceState};
use crate::weights::Weights;

/// Added to the squared norm before the root, as the reference's l2norm does.
const L2_EPS: f32 = 1e-6;

/// How a position's state decay is computed from the layer input.
pub enum Decay {
    /// One factor per value head (Gated DeltaNet):
    /// `−exp(A_log) · softplus(a(x) + dt_bias)`.
    PerHead {
        a: Linear,
        a_log: Vec<f32>,
        dt_bias: Vec<f32>,
    },
    /// One factor per key channel (KDA), `f = f_b(f_a(x))` through a
    /// low-rank pair (Kimi-Linear) or `f_b(x)` at full rank (Ling 3):
    /// `−exp(A_log[head]) · softplus(f + dt_bias)`, or with a
    /// `lower_bound` (the "safe" gate of Ling 3 and GLM-5.3)
    /// `lower_bound · sigmoid(exp(A_log[head]) · (f + dt_bias))`.
    PerChannel {
        f_a: Option<Linear>,
        f_b: Linear,
        a_log: Vec<f32>,
        dt_bias: Vec<f32>,
        lower_bound: Option<f32>,
    },
}

/// What multiplies the normalised output of each head.
pub enum OutputGate {
    /// `silu(z(x))` (Gated DeltaNet).
    Silu(Linear),
    /// `sigmoid(g_b(g_a(x)))` (KDA), or `sigmoid(g_b(x))` at full rank (Ling 3).
    Sigmoid { a: Option<Linear>, b: Linear },
}

/// `b(a(x))`, or `b(x)` without a low-rank first half.
fn low_rank(
    a: Option<&Linear>,
    b: &Linear,
    xs: &[f32],
    seq: usize,
) -> Result<Vec<f32>, ModelError> {
    match a {
        Some(a) => b.forward_values(&a.forward_values(xs, seq)?, seq),
        None => b.forward_values(xs, seq),
    }
}

/// Head counts and sizes of a linear-attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeltaShape {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub kernel: usize,
}

impl DeltaShape {
    fn key_width(&self) -> usize {
        self.k_heads * self.k_dim
    }

    fn value_width(&self) -> usize {
        self.v_heads * self.v_dim
    }

    /// Channels through the convolution: queries, keys, values.
    fn channels(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }

    fn window_len(&self) -> usize {
        self.kernel.saturating_sub(1) * self.channels()
    }

    fn state_len(&self) -> usize {
        self.v_heads * self.k_dim * self.v_dim
    }

    /// Values a layer keeps whatever the context: its state and window.
    pub fn state_values(&self) -> usize {
        self.state_len() + self.window_len()
    }
}

pub struct LinearAttention {
    /// Queries, keys and values before the convolution, in that order.
    pub qkv: Stacked,
    /// `β` logits, one per value head.
    pub beta: Linear,
    pub decay: Decay,
    pub gate: OutputGate,
    /// Depthwise kernel, `[channel][tap]`.
    pub conv: Vec<f32>,
    /// Per-head norm of the output (over `v_dim`).
    pub norm: RmsNorm,
    pub out: Linear,
    pub shape: DeltaShape,
}

/// The depthwise convolution weight: `conv1d.weight` (`[channels, 1, kernel]`),
/// or its query, key and value parts as Kimi-Linear's release stores them.
pub fn load_conv(w: &Weights, s: &DeltaShape) -> Result<Vec<f32>, ModelError> {
    if w.has("conv1d.weight") || !w.has("q_conv1d.weight") {
        return values(&w.get("conv1d.weight", &[s.channels(), 1, s.kernel])?);
    }
    let mut all = Vec::with_capacity(s.channels() * s.kernel);
    for (name, rows) in [
        ("q_conv1d", s.key_width()),
        ("k_conv1d", s.key_width()),
        ("v_conv1d", s.value_width()),
    ] {
        all.extend(values(
            &w.get(&format!("{name}.weight"), &[rows, 1, s.kernel])?,
        )?);
    }
    Ok(all)
}

/// A per-head vector whatever shape it was stored in (`A_log` is `[heads]`
/// in one release and `[1, 1, heads, 1]` in another).
pub fn load_flat(w: &Weights, name: &str, count: usize) -> Result<Vec<f32>, ModelError> {
    let shape = w.shape(name).map(<[usize]>::to_vec).unwrap_or(vec![count]);
    if shape.iter().product::<usize>() != count {
        return Err(crate::weights::WeightsError::Shape {
            name: w.full_name(name),
            path: w.source().location(&w.full_name(name)),
            actual: shape,
            expected: vec![count],
        }
        .into());
    }
    values(&w.get(name, &shape)?)
}

/// Scales each `dim`-wide head of `x` to unit length.
fn l2_normalise(x: &mut [f32], dim: usize) {
    for head in x.chunks_exact_mut(dim.max(1)) {
        let sum: f32 = head.iter().map(|v| v * v).sum();
        let norm = (sum + L2_EPS).sqrt();
        for v in head {
            *v /= norm;
        }
    }
}

/// The causal depthwise convolution then SiLU over `seq` rows of
/// `channels`, continuing from `window` (the previous `kernel − 1` rows),
/// which it leaves holding the last `kernel − 1` rows.
fn convolve(x: &[f32], conv: &[f32], kernel: usize, window: &mut [f32]) -> Vec<f32> {
    let history = kernel.saturating_sub(1);
    let channels = window.len() / history.max(1);
    let channels = if history == 0 {
        conv.len() / kernel.max(1)
    } else {
        channels
    };
    // The window followed by the new rows, position-major.
    let mut all = Vec::with_capacity(window.len() + x.len());
    all.extend_from_slice(window);
    all.extend_from_slice(x);
    let seq = x.len() / channels.max(1);
    let mut y = vec![0f32; x.len()];
    for t in 0..seq {
        for c in 0..channels {
            let taps = &conv[c * kernel..(c + 1) * kernel];
            let mut acc = 0f32;
            for (j, w) in taps.iter().enumerate() {
                acc += w * all[(t + j) * channels + c];
            }
            y[t * channels + c] = silu(acc);
        }
    }
    let keep = all.len() - window.len();
    window.copy_from_slice(&all[keep..]);
    y
}

/// The gated delta rule, one position after another. `q`, `k`:
/// `[seq][k_heads][k_dim]` (normalised, `q` scaled); `v`:
/// `[seq][v_heads][v_dim]`; `log_decay`: `[seq][v_heads][1 or k_dim]`;
/// `beta`: `[seq][v_heads]`. Returns `[seq][v_heads][v_dim]`.
fn delta_rule(
    s: &DeltaShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    log_decay: &[f32],
    beta: &[f32],
    state: &mut [f32],
) -> Vec<f32> {
    let (dk, dv) = (s.k_dim, s.v_dim);
    let seq = beta.len() / s.v_heads.max(1);
    let per_head = log_decay.len() / (seq * s.v_heads).max(1);
    let group = s.v_heads / s.k_heads.max(1);
    let mut out = vec![0f32; seq * s.v_heads * dv];
    let mut kv = vec![0f32; dv];
    for t in 0..seq {
        for h in 0..s.v_heads {
            let kh = h / group.max(1);
            let qh = &q[(t * s.k_heads + kh) * dk..][..dk];
            let kh = &k[(t * s.k_heads + kh) * dk..][..dk];
            let vh = &v[(t * s.v_heads + h) * dv..][..dv];
            let g = &log_decay[(t * s.v_heads + h) * per_head..][..per_head];
            let b = beta[t * s.v_heads + h];
            let st = &mut state[h * dk * dv..(h + 1) * dk * dv];
            kv.fill(0.0);
            for (i, row) in st.chunks_exact_mut(dv).enumerate() {
                let f = exp(g[if per_head == 1 { 0 } else { i }]);
                for (sv, m) in row.iter_mut().zip(kv.iter_mut()) {
                    *sv *= f;
                    *m += *sv * kh[i];
                }
            }
            for (m, &vv) in kv.iter_mut().zip(vh) {
                *m = (vv - *m) * b;
            }
            let o = &mut out[(t * s.v_heads + h) * dv..][..dv];
            for (i, row) in st.chunks_exact_mut(dv).enumerate() {
                for ((sv, d), o) in row.iter_mut().zip(&kv).zip(o.iter_mut()) {
                    *sv += kh[i] * d;
                    *o += *sv * qh[i];
                }
            }
        }
    }
    out
}

impl LinearAttention {
    /// `[seq][v_heads][1 or k_dim]` log-decays for the rows of `xs`.
    fn log_decay(&self, xs: &[f32], seq: usize) -> Result<Vec<f32>, ModelError> {
        let (raw, a_log, dt_bias, lower_bound) = match &self.decay {
            Decay::PerHead { a, a_log, dt_bias } => {
                (a.forward_values(xs, seq)?, a_log, dt_bias, None)
            }
            Decay::PerChannel {
                f_a,
                f_b,
                a_log,
                dt_bias,
                lower_bound,
            } => (
                low_rank(f_a.as_ref(), f_b, xs, seq)?,
                a_log,
                dt_bias,
                *lower_bound,
            ),
        };
        let width = dt_bias.len().max(1);
        let per_head = width / a_log.len().max(1);
        Ok(raw
            .chunks_exact(width)
            .flat_map(|row| {
                row.iter().zip(dt_bias).enumerate().map(move |(i, (x, b))| {
                    let rate = exp(a_log[i / per_head.max(1)]);
                    match lower_bound {
                        Some(bound) => bound * sigmoid(rate * (x + b)),
                        None => -rate * softplus(x + b),
                    }
                })
            })
            .collect())
    }

    pub fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        state: &mut SequenceState,
    ) -> Result<Tensor, ModelError> {
        let s = &self.shape;
        let seq = x.dim(0)?;
        let xs = values(x)?;
        let mixed = self.qkv.forward_values(&xs, seq)?;
        let (window, recurrent) = state.recurrent(layer, s.window_len(), s.state_len())?;
        let mixed = convolve(&mixed, &self.conv, s.kernel, window);
        let (kw, vw) = (s.key_width(), s.value_width());
        let (mut q, mut k, mut v) = (
            Vec::with_capacity(seq * kw),
            Vec::with_capacity(seq * kw),
            Vec::with_capacity(seq * vw),
        );
        for row in mixed.chunks_exact(2 * kw + vw) {
            q.extend_from_slice(&row[..kw]);
            k.extend_from_slice(&row[kw..2 * kw]);
            v.extend_from_slice(&row[2 * kw..]);
        }
        l2_normalise(&mut q, s.k_dim);
        l2_normalise(&mut k, s.k_dim);
        let scale = 1.0 / (s.k_dim as f32).sqrt();
        q.iter_mut().for_each(|v| *v *= scale);
        let beta: Vec<f32> = self
            .beta
            .forward_values(&xs, seq)?
            .into_iter()
            .map(sigmoid)
            .collect();
        let log_decay = self.log_decay(&xs, seq)?;
        let core = delta_rule(s, &q, &k, &v, &log_decay, &beta, recurrent);
        let normed = self.norm.forward_values(&core);
        let gated: Vec<f32> = match &self.gate {
            OutputGate::Silu(z) => normed
                .iter()
                .zip(z.forward_values(&xs, seq)?)
                .map(|(n, g)| n * silu(g))
                .collect(),
            OutputGate::Sigmoid { a, b } => normed
                .iter()
                .zip(low_rank(a.as_ref(), b, &xs, seq)?)
                .map(|(n, g)| n * sigmoid(g))
                .collect(),
        };
        let y = self.out.forward_values(&gated, seq)?;
        Ok(Tensor::from_vec(
            y,
            (seq, self.out.weight().rows()),
            &Device::Cpu,
        )?)
    }
}

/// KDA's tensors under `self_attn` (`w`); the forget gate's may sit in
/// `forget_gate`. The forget and output gates are low-rank pairs
/// (`f_a_proj`/`f_b_proj`, `g_a_proj`/`g_b_proj`: Kimi-Linear, GLM-5.3) or
/// one full-rank projection each (`f_proj`, `g_proj`: Ling 3). With a
/// `lower_bound`, the decay is the safe gate.
pub fn load_kda(
    w: &Weights,
    h: usize,
    s: DeltaShape,
    eps: f64,
    lower_bound: Option<f32>,
) -> Result<LinearAttention, ModelError> {
    let width = s.k_heads * s.k_dim;
    let in_gate = |name: &str| w.has(&format!("forget_gate.{name}.weight"));
    let fw = if in_gate("f_a_proj") || in_gate("f_proj") {
        w.pp("forget_gate")
    } else {
        w.clone()
    };
    // One full-rank projection, or a pair through a `rank`-wide middle.
    let gate = |w: &Weights, full: &str, pair: [&str; 2], rank: usize| {
        if w.has(&format!("{full}.weight")) {
            return Ok((None, Linear::load(w, full, h, width, false)?));
        }
        Ok::<_, ModelError>((
            Some(Linear::load(w, pair[0], h, rank, false)?),
            Linear::load(w, pair[1], rank, width, false)?,
        ))
    };
    let (f_a, f_b) = gate(&fw, "f_proj", ["f_a_proj", "f_b_proj"], s.k_dim)?;
    let (g_a, g_b) = gate(w, "g_proj", ["g_a_proj", "g_b_proj"], s.v_dim)?;
    Ok(LinearAttention {
        qkv: Stacked::new(vec![
            Linear::load(w, "q_proj", h, width, false)?,
            Linear::load(w, "k_proj", h, width, false)?,
            Linear::load(w, "v_proj", h, width, false)?,
        ])?,
        beta: Linear::load(w, "b_proj", h, s.v_heads, false)?,
        decay: Decay::PerChannel {
            f_a,
            f_b,
            a_log: load_flat(&fw, "A_log", s.k_heads)?,
            dt_bias: load_flat(&fw, "dt_bias", width)?,
            lower_bound,
        },
        gate: OutputGate::Sigmoid { a: g_a, b: g_b },
        conv: load_conv(w, &s)?,
        norm: RmsNorm::load(w, "o_norm", s.v_dim, eps)?,
        out: Linear::load(w, "o_proj", width, h, false)?,
        shape: s,
    })
}

#[cfg(test)]
// Inputs and references for the tests, not answers: std's functions do.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    /// The recurrent form against the rule written out for one head with
    /// a scalar decay: S ← g·S; S ← S + k ⊗ β(v − Sᵀk); o = Sᵀq.
    #[test]
    fn the_delta_rule_follows_its_definition() {
        let s = DeltaShape {
            k_heads: 1,
            v_heads: 2,
            k_dim: 2,
            v_dim: 3,
            kernel: 1,
        };
        let q = [0.6, 0.8, 1.0, 0.0];
        let k = [0.0, 1.0, 0.8, 0.6];
        let v = [1.0, 2.0, 3.0, -1.0, 0.5, 0.0, 2.0, 2.0, 2.0, 0.0, 0.0, 1.0];
        let log_decay = [-0.1, -0.2, -0.3, -0.4];
        let beta = [0.5, 1.0, 0.25, 0.75];
        let mut state = vec![0f32; s.state_len()];
        let out = delta_rule(&s, &q, &k, &v, &log_decay, &beta, &mut state);
        let mut want_state = [[[0f32; 3]; 2]; 2];
        let mut want = Vec::new();
        for t in 0..2 {
            for h in 0..2 {
                let st = &mut want_state[h];
                let g = exp(log_decay[t * 2 + h]);
                let (qt, kt) = (&q[t * 2..t * 2 + 2], &k[t * 2..t * 2 + 2]);
                let vt = &v[(t * 2 + h) * 3..(t * 2 + h) * 3 + 3];
                for row in st.iter_mut() {
                    row.iter_mut().for_each(|x| *x *= g);
                }
                for j in 0..3 {
                    let mem = st[0][j] * kt[0] + st[1][j] * kt[1];
                    let d = (vt[j] - mem) * beta[t * 2 + h];
                    st[0][j] += kt[0] * d;
                    st[1][j] += kt[1] * d;
                }
                for (a, b) in st[0].iter().zip(&st[1]) {
                    want.push(a * qt[0] + b * qt[1]);
                }
            }
        }
        for (a, b) in out.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{out:?} vs {want:?}");
        }
    }

    /// Rows convolved in one call or one at a time agree bitwise, and the
    /// window carries the last inputs.
    #[test]
    fn the_convolution_continues_across_calls() {
        let (channels, kernel) = (3, 4);
        let conv: Vec<f32> = (0..channels * kernel)
            .map(|i| 0.1 * i as f32 - 0.4)
            .collect();
        let x: Vec<f32> = (0..5 * channels).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut window = vec![0f32; (kernel - 1) * channels];
        let all = convolve(&x, &conv, kernel, &mut window);
        let mut stepped_window = vec![0f32; (kernel - 1) * channels];
        let stepped: Vec<f32> = x
            .chunks_exact(channels)
            .flat_map(|row| convolve(row, &conv, kernel, &mut stepped_window))
            .collect();
        assert_eq!(all, stepped);
        assert_eq!(window, stepped_window);
        assert_eq!(window, x[2 * channels..]);
    }
}
