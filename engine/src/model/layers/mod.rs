//! Building blocks shared by every architecture. An architecture file only
//! says which blocks it uses and where its weights are named.

pub mod attention;
pub mod decoder;
pub mod experts;
pub mod mla;
pub mod moe;
pub mod rope;
pub mod router;

use candle_core::Tensor;

use crate::model::ModelError;
use crate::weights::Weights;

/// `y = x·Wᵀ (+ b)`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
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
        let weight = w.get(&format!("{name}.weight"), &[output, input])?;
        let bias = if bias {
            Some(w.get(&format!("{name}.bias"), &[output])?)
        } else {
            None
        };
        Ok(Self { weight, bias })
    }

    pub fn from_weight(weight: Tensor) -> Self {
        Self { weight, bias: None }
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let y = x.matmul(&self.weight.t()?)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// Root-mean-square normalisation over the last dimension, computed in f32.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub fn load(w: &Weights, name: &str, dim: usize, eps: f64) -> Result<Self, ModelError> {
        Ok(Self {
            weight: w.get(&format!("{name}.weight"), &[dim])?,
            eps: eps as f32,
        })
    }

    pub fn from_weight(weight: Tensor, eps: f64) -> Self {
        Self {
            weight,
            eps: eps as f32,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        Ok(candle_nn::ops::rms_norm(
            &x.contiguous()?,
            &self.weight,
            self.eps,
        )?)
    }
}

/// The SwiGLU feed-forward used for dense layers and shared experts.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    /// Loads `{gate,up,down}_proj` under `w`.
    pub fn load(w: &Weights, hidden: usize, intermediate: usize) -> Result<Self, ModelError> {
        Ok(Self {
            gate: Linear::load(w, "gate_proj", hidden, intermediate, false)?,
            up: Linear::load(w, "up_proj", hidden, intermediate, false)?,
            down: Linear::load(w, "down_proj", intermediate, hidden, false)?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let act = (candle_nn::ops::silu(&self.gate.forward(x)?)? * self.up.forward(x)?)?;
        self.down.forward(&act)
    }
}
