//! Routed experts and the narrow interface through which model code gets them.
//!
//! Model code asks an [`ExpertProvider`] for "the experts (layer, ids)" and
//! gets back shared handles; it never learns whether they were held in RAM or
//! read from a drive. The in-memory provider here loads every expert up front;
//! a streaming provider implements the same trait.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::kernels::Matrix;
use crate::kernels::ops::{clamped_swiglu, limited_swiglu, silu_clamped, swiglu};
use crate::model::ModelError;
use crate::weights::Weights;

/// How an expert turns its gate and up products into the down product's input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `silu(gate) · up`.
    Swiglu,
    /// gpt-oss: the gate clamped above at `limit`, up clamped to ±`limit`,
    /// then `gate · σ(alpha · gate) · (up + 1)`.
    ClampedSwiglu { alpha: f32, limit: f32 },
    /// DeepSeek-V4: `silu(min(gate, limit)) · clamp(up, ±limit)`.
    LimitedSwiglu { limit: f32 },
    /// Step: `min(silu(gate), limit) · clamp(up, ±limit)`.
    SiluClamped { limit: f32 },
}

impl Activation {
    /// The activation of one row's gate and up products.
    pub fn apply(self, gate: &[f32], up: &[f32]) -> Vec<f32> {
        match self {
            Activation::Swiglu => swiglu(gate, up),
            Activation::ClampedSwiglu { alpha, limit } => clamped_swiglu(gate, up, alpha, limit),
            Activation::LimitedSwiglu { limit } => limited_swiglu(gate, up, limit),
            Activation::SiluClamped { limit } => silu_clamped(gate, up, limit),
        }
    }
}

/// One expert's biases, for families whose experts have them (gpt-oss):
/// gate rows then up rows, and down.
#[derive(Debug, Clone, Copy)]
pub struct ExpertBias<'a> {
    pub gate_up: &'a [f32],
    pub down: &'a [f32],
}

/// One routed expert's SwiGLU weights, with gate and up fused for one product.
#[derive(Debug)]
pub struct Expert {
    /// `[2 × intermediate, hidden]`: gate rows first, then up rows.
    gate_up: Matrix,
    /// `[hidden, intermediate]`.
    down: Matrix,
    intermediate: usize,
}

impl Expert {
    pub fn new(gate_up: Matrix, down: Matrix) -> Result<Self, ModelError> {
        let intermediate = gate_up.rows() / 2;
        let consistent = gate_up.rows() == 2 * intermediate
            && down.cols() == intermediate
            && down.rows() == gate_up.cols();
        if !consistent {
            return Err(ModelError::Internal(
                "expert matrices do not fit together (gate/up [2I, H], down [H, I])",
            ));
        }
        Ok(Self {
            gate_up,
            down,
            intermediate,
        })
    }

    /// Rows of the gate (and of the up) projection.
    pub fn intermediate(&self) -> usize {
        self.intermediate
    }

    /// Bytes the weights take in RAM.
    pub fn ram_bytes(&self) -> u64 {
        self.gate_up.stored_bytes() + self.down.stored_bytes()
    }

    /// `down(silu(gate(x)) * up(x))` for the `n` rows of `x` (`n × hidden`),
    /// computed from the weights as stored, on the calling thread (experts
    /// are computed side by side).
    pub fn forward(&self, x: &[f32], n: usize) -> Result<Vec<f32>, ModelError> {
        self.forward_with(x, n, Activation::Swiglu, None)
    }

    /// [`Expert::forward`] with a family's activation and biases: each bias
    /// is added after its product, as the reference adds it.
    pub fn forward_with(
        &self,
        x: &[f32],
        n: usize,
        activation: Activation,
        bias: Option<ExpertBias<'_>>,
    ) -> Result<Vec<f32>, ModelError> {
        let i = self.intermediate;
        let mut h = self.gate_up.matmul_serial(x, n)?;
        if let Some(b) = bias {
            add_rows(&mut h, b.gate_up);
        }
        let mut act = Vec::with_capacity(n * i);
        for row in h.chunks_exact((2 * i).max(1)) {
            let (gate, up) = row.split_at(i);
            act.extend(activation.apply(gate, up));
        }
        let mut y = self.down.matmul_serial(&act, n)?;
        if let Some(b) = bias {
            add_rows(&mut y, b.down);
        }
        Ok(y)
    }
}

/// Adds `bias` to every row of `rows` (rows as wide as `bias`).
fn add_rows(rows: &mut [f32], bias: &[f32]) {
    for row in rows.chunks_exact_mut(bias.len().max(1)) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// Errors from fetching experts, kept apart so a streaming provider can name
/// the drive, file and offset that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExpertError {
    #[error("layer {layer} has no routed experts")]
    NoSuchLayer { layer: usize },
    #[error("layer {layer} has {count} experts; expert {id} does not exist")]
    NoSuchExpert {
        layer: usize,
        id: usize,
        count: usize,
    },
    #[error("{0}")]
    Source(String),
}

/// A layer's experts as they become available: (position in the request,
/// expert), in no particular order.
pub type ExpertStream<'a> =
    Box<dyn Iterator<Item = Result<(usize, Arc<Expert>), ExpertError>> + 'a>;

/// Hands out routed experts by (layer, ids).
pub trait ExpertProvider: Send + Sync {
    /// Starts getting experts `ids` of `layer` and hands each over as soon as
    /// it is available, so the caller can compute with the first while the
    /// others are on their way. Results are exact whatever the order.
    /// `rows[i]` is how many rows of the pass `ids[i]` computes (one while
    /// decoding): what the cache's statistics weigh a lookup by.
    fn fetch<'a>(
        &'a self,
        layer: usize,
        ids: &[usize],
        rows: &[u32],
    ) -> Result<ExpertStream<'a>, ExpertError>;

    /// A hint that `layer` will soon ask for `ids`. Providers that hold
    /// everything in RAM ignore it.
    fn prefetch(&self, _layer: usize, _ids: &[usize]) {}

    /// Whether [`ExpertProvider::prefetch`] hints are worth computing.
    fn wants_hints(&self) -> bool {
        false
    }
}

/// Every routed expert held in RAM.
#[derive(Debug, Default)]
pub struct ResidentExperts {
    layers: BTreeMap<usize, Vec<Arc<Expert>>>,
}

impl ResidentExperts {
    pub fn insert_layer(&mut self, layer: usize, experts: Vec<Arc<Expert>>) {
        self.layers.insert(layer, experts);
    }
}

impl ExpertProvider for ResidentExperts {
    fn fetch<'a>(
        &'a self,
        layer: usize,
        ids: &[usize],
        _rows: &[u32],
    ) -> Result<ExpertStream<'a>, ExpertError> {
        let all = self
            .layers
            .get(&layer)
            .ok_or(ExpertError::NoSuchLayer { layer })?;
        let experts = ids
            .iter()
            .map(|&id| {
                all.get(id).cloned().ok_or(ExpertError::NoSuchExpert {
                    layer,
                    id,
                    count: all.len(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Box::new(experts.into_iter().enumerate().map(Ok)))
    }
}

/// Where a model being built gets its routed experts: loaded into RAM from the
/// checkpoint as layers are built, or from a provider given by the caller.
pub enum ExpertSetup {
    Resident(ResidentExperts),
    Provided(Arc<dyn ExpertProvider>),
}

impl ExpertSetup {
    pub fn new(provided: Option<Arc<dyn ExpertProvider>>) -> Self {
        match provided {
            Some(p) => Self::Provided(p),
            None => Self::Resident(ResidentExperts::default()),
        }
    }

    /// Registers decoder layer `layer`'s experts, loading them from `w` (the
    /// MoE block) when they are to be held in RAM.
    pub fn add_layer(
        &mut self,
        w: &Weights,
        names: ExpertNames,
        layer: usize,
        shape: ExpertShape,
    ) -> Result<(), ModelError> {
        if let Self::Resident(resident) = self {
            resident.insert_layer(layer, load_layer_experts(w, names, shape)?);
        }
        Ok(())
    }

    pub fn into_provider(self) -> Arc<dyn ExpertProvider> {
        match self {
            Self::Resident(r) => Arc::new(r),
            Self::Provided(p) => p,
        }
    }
}

/// Count and sizes of one layer's routed experts.
#[derive(Debug, Clone, Copy)]
pub struct ExpertShape {
    pub count: usize,
    pub hidden: usize,
    pub intermediate: usize,
}

/// How a checkpoint names one layer's routed experts, relative to the MoE block.
#[derive(Debug, Clone, Copy)]
pub struct ExpertNames {
    /// Folder of the experts under the MoE block (`experts`).
    pub folder: &'static str,
    pub gate: &'static str,
    pub up: &'static str,
    pub down: &'static str,
}

/// Names used by Qwen3-MoE and DeepSeek-V3 releases.
pub const PROJ_NAMES: ExpertNames = ExpertNames {
    folder: "experts",
    gate: "gate_proj",
    up: "up_proj",
    down: "down_proj",
};

/// Names used by Mixtral releases.
pub const MIXTRAL_NAMES: ExpertNames = ExpertNames {
    folder: "experts",
    gate: "w1",
    up: "w3",
    down: "w2",
};

/// Loads one layer's experts from `w` (the MoE block), accepting
/// per-expert tensors (`experts.E.gate_proj.weight`, …), the fused 3-D
/// tensors recent transformers versions write (`experts.gate_up_proj`
/// `[E, 2I, H]`, `experts.down_proj` `[E, H, I]`), or one stack per
/// projection (`experts.gate_proj.weight` `[E, I, H]`, …).
pub fn load_layer_experts(
    w: &Weights,
    names: ExpertNames,
    shape: ExpertShape,
) -> Result<Vec<Arc<Expert>>, ModelError> {
    let ExpertShape {
        count,
        hidden,
        intermediate,
    } = shape;
    let experts = w.pp(names.folder);
    if experts.has("gate_proj.weight") {
        // Step's release: a stack of every expert's gate, one of ups, one of downs.
        let gate = experts.matrix_stack("gate_proj.weight", count, intermediate, hidden)?;
        let up = experts.matrix_stack("up_proj.weight", count, intermediate, hidden)?;
        let down = experts.matrix_stack("down_proj.weight", count, hidden, intermediate)?;
        return gate
            .iter()
            .zip(&up)
            .zip(down)
            .map(|((g, u), d)| Ok(Arc::new(Expert::new(Matrix::stack(&[g, u])?, d)?)))
            .collect();
    }
    if experts.has("gate_up_proj") {
        // LongCat-Flash's stack holds its identity experts too; the first
        // `count` are the computed ones.
        let stored = experts
            .shape("gate_up_proj")
            .and_then(|s| s.first().copied())
            .filter(|&n| n > count)
            .unwrap_or(count);
        let mut gate_up = experts.matrix_stack("gate_up_proj", stored, 2 * intermediate, hidden)?;
        gate_up.truncate(count);
        let down = experts.matrix_stack("down_proj", count, hidden, intermediate)?;
        return gate_up
            .into_iter()
            .zip(down)
            .map(|(gu, d)| Ok(Arc::new(Expert::new(gu, d)?)))
            .collect();
    }
    (0..count)
        .map(|e| {
            let one = experts.pp(e);
            let gate = one.matrix(&format!("{}.weight", names.gate), intermediate, hidden)?;
            let up = one.matrix(&format!("{}.weight", names.up), intermediate, hidden)?;
            let down = one.matrix(&format!("{}.weight", names.down), hidden, intermediate)?;
            Ok(Arc::new(Expert::new(Matrix::stack(&[&gate, &up])?, down)?))
        })
        .collect()
}
