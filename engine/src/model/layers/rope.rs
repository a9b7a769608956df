//! Rotary position embeddings, shared by every architecture.
//!
//! The inverse frequencies follow transformers' `modeling_rope_utils`
//! (default, linear and YaRN), computed in f32 like the reference so that
//! positions far into a long context rotate by the same angles.

use crate::kernels::math::{self, ln, powf};
use crate::model::ModelError;

/// Which frequency schedule a model was trained with.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeKind {
    Default,
    Linear {
        factor: f64,
    },
    Yarn {
        factor: f64,
        attention_factor: Option<f64>,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        beta_fast: f64,
        beta_slow: f64,
        original_max_position_embeddings: usize,
        truncate: bool,
    },
    /// Hunyuan's fixed NTK stretch (`"dynamic"` with an `alpha`): the base
    /// becomes `theta · alpha^(d / (d - 2))` for heads of `d` lanes, at
    /// every position (unlike dynamic NTK, which grows with the sequence).
    NtkAlpha {
        alpha: f64,
    },
    /// Llama 3.1's (Llama 4, Step): wavelengths beyond the original
    /// context's `/ low_freq_factor` are stretched by `factor`, those below
    /// its `/ high_freq_factor` kept, the band between blended.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

/// Rope settings as read from a config.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeParams {
    pub theta: f64,
    pub partial_rotary_factor: f64,
    pub kind: RopeKind,
}

/// YaRN's attention-magnitude correction for a context stretched by `scale`.
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * ln(scale) + 1.0
    }
}

impl RopeParams {
    /// DeepSeek's MLA multiplies the softmax scale by `mscale(factor, mscale_all_dim)²`
    /// whenever a scaled rope is configured.
    pub fn mla_softmax_scale(&self, base: f64) -> f64 {
        match &self.kind {
            RopeKind::Default => base,
            RopeKind::Linear { .. } | RopeKind::NtkAlpha { .. } | RopeKind::Llama3 { .. } => base,
            RopeKind::Yarn {
                factor,
                mscale_all_dim,
                ..
            } => match mscale_all_dim {
                Some(m) if *m != 0.0 => {
                    let s = yarn_mscale(*factor, *m);
                    base * s * s
                }
                _ => base,
            },
        }
    }

    /// Inverse frequencies for a head of `head_dim` and the factor applied to cos/sin.
    pub fn frequencies(&self, head_dim: usize) -> (Vec<f32>, f32) {
        let dim = (head_dim as f64 * self.partial_rotary_factor) as usize;
        let half = dim / 2;
        let theta = match &self.kind {
            RopeKind::NtkAlpha { alpha } if head_dim > 2 => {
                let d = head_dim as f64;
                self.theta * powf(*alpha, d / (d - 2.0))
            }
            _ => self.theta,
        };
        // base^(2i/dim), in f32 like the reference.
        let pos_freqs: Vec<f32> = (0..half)
            .map(|i| {
                let exponent = (2 * i) as f32 / dim as f32;
                powf(theta, exponent as f64) as f32
            })
            .collect();
        let base: Vec<f32> = pos_freqs.iter().map(|p| 1.0 / p).collect();
        match &self.kind {
            RopeKind::Default | RopeKind::NtkAlpha { .. } => (base, 1.0),
            RopeKind::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                // In f32, as the reference computes it; the blend is
                // computed only inside the band, where its divisor is not 0.
                let (factor, low, high) = (
                    *factor as f32,
                    *low_freq_factor as f32,
                    *high_freq_factor as f32,
                );
                let original = *original_max_position_embeddings as f32;
                let (low_wavelen, high_wavelen) = (original / low, original / high);
                let inv = base
                    .iter()
                    .map(|&f| {
                        let wavelen = std::f32::consts::TAU / f;
                        if wavelen > low_wavelen {
                            f / factor
                        } else if wavelen < high_wavelen {
                            f
                        } else {
                            let smooth = (original / wavelen - low) / (high - low);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect();
                (inv, 1.0)
            }
            RopeKind::Linear { factor } => (base.iter().map(|f| f / *factor as f32).collect(), 1.0),
            RopeKind::Yarn {
                factor,
                attention_factor,
                mscale,
                mscale_all_dim,
                beta_fast,
                beta_slow,
                original_max_position_embeddings,
                truncate,
            } => {
                let attention =
                    attention_factor.unwrap_or_else(|| match (mscale, mscale_all_dim) {
                        (Some(m), Some(a)) if *m != 0.0 && *a != 0.0 => {
                            yarn_mscale(*factor, *m) / yarn_mscale(*factor, *a)
                        }
                        _ => yarn_mscale(*factor, 1.0),
                    });
                let correction_dim = |rotations: f64| {
                    (dim as f64
                        * ln(*original_max_position_embeddings as f64
                            / (rotations * 2.0 * std::f64::consts::PI)))
                        / (2.0 * ln(self.theta))
                };
                let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let high = high.min(dim as f64 - 1.0);
                let high = if low == high { high + 0.001 } else { high };
                let (low, high) = (low as f32, high as f32);
                let factor = *factor as f32;
                let inv: Vec<f32> = pos_freqs
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation_weight = 1.0 - ramp;
                        let interpolation = 1.0 / (factor * p);
                        let extrapolation = 1.0 / p;
                        interpolation * (1.0 - extrapolation_weight)
                            + extrapolation * extrapolation_weight
                    })
                    .collect();
                (inv, attention as f32)
            }
        }
    }
}

/// Precomputed frequencies for one head size, applied to `[heads, seq, dim]` tensors.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    scale: f32,
    /// DeepSeek stores rotary pairs interleaved `(x0, x1), (x2, x3)…`.
    interleaved: bool,
}

impl Rope {
    pub fn new(params: &RopeParams, head_dim: usize, interleaved: bool) -> Self {
        let (inv_freq, scale) = params.frequencies(head_dim);
        Self {
            inv_freq,
            scale,
            interleaved,
        }
    }

    /// The rotated width (may be less than the head size with partial rotary).
    pub fn dim(&self) -> usize {
        self.inv_freq.len() * 2
    }

    /// cos and sin tables `[seq, dim/2]` for positions `start..start+seq`.
    pub fn tables(&self, start: usize, seq: usize) -> RopeTables {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(seq * half);
        let mut sin = Vec::with_capacity(seq * half);
        for pos in start..start + seq {
            for f in &self.inv_freq {
                let angle = pos as f32 * f;
                cos.push(math::cos(angle) * self.scale);
                sin.push(math::sin(angle) * self.scale);
            }
        }
        RopeTables { cos, sin, half }
    }

    /// Rotates `x`, laid out `[seq][heads][stride]`, in place: for each
    /// position and head, the [`Rope::dim`] values from `offset`. As in the
    /// reference: `x₁·cos − x₂·sin`, `x₁·sin + x₂·cos` over the two halves,
    /// after gathering even then odd lanes when pairs are interleaved.
    pub fn rotate(
        &self,
        x: &mut [f32],
        heads: usize,
        stride: usize,
        offset: usize,
        tables: &RopeTables,
    ) -> Result<(), ModelError> {
        let half = self.inv_freq.len();
        let mut gathered = vec![0f32; 2 * half];
        self.each_row(x, heads, stride, offset, tables, |v, cos, sin| {
            if self.interleaved {
                for j in 0..half {
                    gathered[j] = v[2 * j];
                    gathered[half + j] = v[2 * j + 1];
                }
                v.copy_from_slice(&gathered);
            }
            let (lo, hi) = v.split_at_mut(half);
            for j in 0..half {
                let (a, b) = (lo[j], hi[j]);
                lo[j] = a * cos[j] - b * sin[j];
                hi[j] = a * sin[j] + b * cos[j];
            }
        })
    }

    /// Turns adjacent pairs `(2j, 2j+1)` of each row's `offset..` lanes in
    /// place, keeping them interleaved (DeepSeek-V4), by the angle of row
    /// `i / heads`'s position; `inverse` turns them back.
    pub fn rotate_pairs(
        &self,
        x: &mut [f32],
        heads: usize,
        stride: usize,
        offset: usize,
        tables: &RopeTables,
        inverse: bool,
    ) -> Result<(), ModelError> {
        let sign = if inverse { -1.0 } else { 1.0 };
        self.each_row(x, heads, stride, offset, tables, |v, cos, sin| {
            for j in 0..cos.len() {
                let (a, b, s) = (v[2 * j], v[2 * j + 1], sign * sin[j]);
                v[2 * j] = a * cos[j] - b * s;
                v[2 * j + 1] = b * cos[j] + a * s;
            }
        })
    }

    /// Calls `turn` with each row's rotated lanes (`[seq][heads][stride]`,
    /// [`Rope::dim`] lanes from `offset`) and its position's cos and sin.
    fn each_row(
        &self,
        x: &mut [f32],
        heads: usize,
        stride: usize,
        offset: usize,
        tables: &RopeTables,
        mut turn: impl FnMut(&mut [f32], &[f32], &[f32]),
    ) -> Result<(), ModelError> {
        let half = self.inv_freq.len();
        if half == 0 && tables.half == 0 {
            // A rope of no lanes (a model without rotary): nothing turns.
            return Ok(());
        }
        if half != tables.half || offset + 2 * half > stride || stride == 0 {
            return Err(ModelError::Internal("rope width does not fit the heads"));
        }
        for (i, row) in x.chunks_exact_mut(stride).enumerate() {
            let t = i / heads.max(1);
            let (Some(cos), Some(sin)) = (
                tables.cos.get(t * half..(t + 1) * half),
                tables.sin.get(t * half..(t + 1) * half),
            ) else {
                return Err(ModelError::Internal(
                    "rope tables shorter than the sequence",
                ));
            };
            turn(&mut row[offset..offset + 2 * half], cos, sin);
        }
        Ok(())
    }
}

/// cos and sin of every rotated pair's angle at consecutive positions,
/// `[seq][half]`, scaled as the rope kind asks.
#[derive(Debug, Clone)]
pub struct RopeTables {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_frequencies_match_the_closed_form() {
        let p = RopeParams {
            theta: 10000.0,
            partial_rotary_factor: 1.0,
            kind: RopeKind::Default,
        };
        let (f, s) = p.frequencies(8);
        assert_eq!(s, 1.0);
        assert_eq!(f.len(), 4);
        assert!((f[1] - 0.1).abs() < 1e-7);
    }

    #[test]
    fn yarn_keeps_high_frequencies_and_stretches_low_ones() {
        let p = RopeParams {
            theta: 10000.0,
            partial_rotary_factor: 1.0,
            kind: RopeKind::Yarn {
                factor: 40.0,
                attention_factor: None,
                mscale: Some(1.0),
                mscale_all_dim: Some(1.0),
                beta_fast: 32.0,
                beta_slow: 1.0,
                original_max_position_embeddings: 4096,
                truncate: true,
            },
        };
        let (base, _) = RopeParams {
            kind: RopeKind::Default,
            ..p.clone()
        }
        .frequencies(64);
        let (f, s) = p.frequencies(64);
        assert_eq!(s, 1.0, "mscale == mscale_all_dim cancels");
        assert_eq!(f[0], base[0]);
        assert!((f[31] - base[31] / 40.0).abs() < 1e-12);
    }
}
