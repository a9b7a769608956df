//! Building blocks shared by every architecture. An architecture file only
//! says which blocks it uses and where its weights are named.

pub mod attention;
pub mod compressed;
pub mod decoder;
pub mod embedding;
pub mod experts;
pub mod hyper;
pub mod indexer;
pub mod linear;
pub mod mla;
pub mod moe;
pub mod rope;
pub mod router;
pub mod stacked;

use candle_core::{Device, Tensor};

use crate::kernels::Matrix;
use crate::kernels::ops::{rms_norm, swiglu};
use crate::model::ModelError;
use crate::weights::Weights;

/// The values of `x` (any shape), row-major.
pub(crate) fn values(x: &Tensor) -> Result<Vec<f32>, ModelError> {
    Ok(x.flatten_all()?.to_vec1::<f32>()?)
}

/// `x`'s dims with the last one replaced by `last`.
fn with_last(x: &Tensor, last: usize) -> Vec<usize> {
    let mut dims = x.dims().to_vec();
    if let Some(d) = dims.last_mut() {
        *d = last;
    }
    dims
}

/// `y = x·Wᵀ (+ b)`, with `W` at its stored width.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Matrix,
    bias: Option<Vec<f32>>,
}

impl Linear {
    /// Loads `{name}.weight` of shape `[out, in]` and, when `bias` is set, `{name}.bias`.
    pub fn load(
        w: &Weights,
        name: &str,
        input: usize,
        output: usize,
        bias: bool,
    ) -> Result<Self, ModelError> {
        let weight = w.matrix(&format!("{name}.weight"), output, input)?;
        let bias = if bias {
            Some(values(&w.get(&format!("{name}.bias"), &[output])?)?)
        } else {
            None
        };
        Ok(Self { weight, bias })
    }

    pub fn from_matrix(weight: Matrix) -> Self {
        Self { weight, bias: None }
    }

    /// Layers of one input stacked into one whose output is theirs, one
    /// after another: one product instead of several, the same numbers.
    pub fn stack(parts: &[Linear]) -> Result<Self, ModelError> {
        let weights: Vec<&Matrix> = parts.iter().map(|p| &p.weight).collect();
        let weight = Matrix::stack(&weights)?;
        let bias = if parts.iter().any(|p| p.bias.is_some()) {
            let mut all = Vec::with_capacity(weight.rows());
            for p in parts {
                match &p.bias {
                    Some(b) => all.extend_from_slice(b),
                    None => all.extend(std::iter::repeat_n(0.0, p.weight.rows())),
                }
            }
            Some(all)
        } else {
            None
        };
        Ok(Self { weight, bias })
    }

    /// A layer over an f32 `[out, in]` tensor.
    pub fn from_tensor(weight: &Tensor) -> Result<Self, ModelError> {
        let (rows, cols) = weight.dims2()?;
        Ok(Self::from_matrix(Matrix::from_f32(
            rows,
            cols,
            &values(weight)?,
        )?))
    }

    pub fn weight(&self) -> &Matrix {
        &self.weight
    }

    /// `y` for the `n` rows of `x` (`n × in`), as `n × out` values.
    pub fn forward_values(&self, x: &[f32], n: usize) -> Result<Vec<f32>, ModelError> {
        let mut y = self.weight.matmul(x, n)?;
        if let Some(b) = &self.bias {
            for row in y.chunks_mut(b.len().max(1)) {
                for (v, b) in row.iter_mut().zip(b) {
                    *v += b;
                }
            }
        }
        Ok(y)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let n = x.elem_count() / self.weight.cols().max(1);
        let y = self.forward_values(&values(x)?, n)?;
        Ok(Tensor::from_vec(
            y,
            with_last(x, self.weight.rows()),
            &Device::Cpu,
        )?)
    }
}

/// Layers of one input whose outputs are concatenated: one product when
/// their weights share a format, one per layer otherwise (a GGUF may store
/// q, k and v in different block types). Each output is one row's dot
/// product either way, so the numbers are the same.
#[derive(Debug, Clone)]
pub enum Stacked {
    One(Linear),
    Each(Vec<Linear>),
}

impl Stacked {
    pub fn new(parts: Vec<Linear>) -> Result<Self, ModelError> {
        let first = parts.first().map(|p| (p.weight.format(), p.weight.cols()));
        if parts
            .iter()
            .all(|p| Some((p.weight.format(), p.weight.cols())) == first)
        {
            Ok(Stacked::One(Linear::stack(&parts)?))
        } else {
            Ok(Stacked::Each(parts))
        }
    }

    /// Outputs of all layers for `n` rows of `x`, row by row.
    pub fn forward_values(&self, x: &[f32], n: usize) -> Result<Vec<f32>, ModelError> {
        let parts = match self {
            Stacked::One(l) => return l.forward_values(x, n),
            Stacked::Each(parts) => parts,
        };
        let outs = parts
            .iter()
            .map(|p| p.forward_values(x, n))
            .collect::<Result<Vec<_>, _>>()?;
        let widths: Vec<usize> = parts.iter().map(|p| p.weight.rows()).collect();
        let mut y = Vec::with_capacity(n * widths.iter().sum::<usize>());
        for row in 0..n {
            for (out, &w) in outs.iter().zip(&widths) {
                y.extend_from_slice(&out[row * w..(row + 1) * w]);
            }
        }
        Ok(y)
    }
}

/// Root-mean-square normalisation over the last dimension, computed in f32.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    pub fn load(w: &Weights, name: &str, dim: usize, eps: f64) -> Result<Self, ModelError> {
        Self::load_offset(w, name, dim, eps, 0.0)
    }

    /// A norm that scales by `offset + weight`: zero-centred norms (Qwen3-Next)
    /// store `weight` around 0 and scale by `1 + weight`.
    pub fn load_offset(
        w: &Weights,
        name: &str,
        dim: usize,
        eps: f64,
        offset: f32,
    ) -> Result<Self, ModelError> {
        let mut weight = values(&w.get(&format!("{name}.weight"), &[dim])?)?;
        if offset != 0.0 {
            weight.iter_mut().for_each(|v| *v += offset);
        }
        Ok(Self {
            weight,
            eps: eps as f32,
        })
    }

    /// This norm with its weights multiplied by `factor` (a scale on its
    /// output folded in: LongCat's LoRA scaling).
    pub fn scaled(mut self, factor: f32) -> Self {
        self.weight.iter_mut().for_each(|w| *w *= factor);
        self
    }

    /// A norm without a learnt scale (every weight 1, which multiplies exactly).
    pub fn unweighted(dim: usize, eps: f64) -> Self {
        Self {
            weight: vec![1.0; dim],
            eps: eps as f32,
        }
    }

    pub fn from_weight(weight: Tensor, eps: f64) -> Result<Self, ModelError> {
        Ok(Self {
            weight: values(&weight)?,
            eps: eps as f32,
        })
    }

    pub fn forward_values(&self, x: &[f32]) -> Vec<f32> {
        rms_norm(x, &self.weight, self.eps)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let y = self.forward_values(&values(x)?);
        Ok(Tensor::from_vec(y, x.dims(), &Device::Cpu)?)
    }
}

/// Layer normalisation with a bias (`nn.LayerNorm`), computed in f32.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    pub fn new(weight: Vec<f32>, bias: Vec<f32>, eps: f32) -> Self {
        Self { weight, bias, eps }
    }

    pub fn forward_values(&self, x: &[f32]) -> Vec<f32> {
        crate::kernels::ops::layer_norm(x, &self.weight, &self.bias, self.eps)
    }
}

/// The SwiGLU feed-forward used for dense layers and shared experts.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
    pub activation: experts::Activation,
}

impl Mlp {
    /// Loads `{gate,up,down}_proj` under `w`.
    pub fn load(w: &Weights, hidden: usize, intermediate: usize) -> Result<Self, ModelError> {
        Ok(Self {
            gate: Linear::load(w, "gate_proj", hidden, intermediate, false)?,
            up: Linear::load(w, "up_proj", hidden, intermediate, false)?,
            down: Linear::load(w, "down_proj", intermediate, hidden, false)?,
            activation: experts::Activation::Swiglu,
        })
    }

    /// The block on `n` rows of `x`.
    pub fn forward_values(&self, x: &[f32], n: usize) -> Result<Vec<f32>, ModelError> {
        let (gate, up) = (
            self.gate.forward_values(x, n)?,
            self.up.forward_values(x, n)?,
        );
        let act = match self.activation {
            experts::Activation::Swiglu => swiglu(&gate, &up),
            other => {
                let i = self.gate.weight.rows().max(1);
                let mut act = Vec::with_capacity(gate.len());
                for (g, u) in gate.chunks_exact(i).zip(up.chunks_exact(i)) {
                    act.extend(other.apply(g, u));
                }
                act
            }
        };
        self.down.forward_values(&act, n)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let n = x.elem_count() / self.gate.weight.cols().max(1);
        let y = self.forward_values(&values(x)?, n)?;
        Ok(Tensor::from_vec(y, x.dims(), &Device::Cpu)?)
    }
}
