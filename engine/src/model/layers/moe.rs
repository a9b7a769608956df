//! A sparse MoE block: route, fetch the chosen experts, combine.
//!
//! Experts are applied in ascending id order and their outputs added into the
//! result in that order, so the sum is the same whatever order the experts
//! arrived in — one half of the exactness invariant.

use std::collections::BTreeMap;
use std::sync::Mutex;

use candle_core::{Device, Tensor};

use super::experts::{Activation, Expert, ExpertBias, ExpertProvider, ExpertStream};
use super::router::{Router, Scoring};
use super::{Linear, Mlp, values};
use crate::kernels::math::sigmoid;
use crate::model::ModelError;
use crate::weights::Weights;

pub struct MoeBlock {
    /// Decoder layer index, as the expert provider knows it.
    pub layer: usize,
    pub router: Router,
    pub shared: Option<Mlp>,
    /// Scales the shared expert's output by `sigmoid(gate · x)` (Qwen3-Next).
    pub shared_gate: Option<Box<Linear>>,
    pub extras: ExpertExtras,
}

/// What a family adds around its routed experts' products.
#[derive(Debug, Clone)]
pub struct ExpertExtras {
    pub activation: Activation,
    /// Per-expert biases (gpt-oss), resident: they are small next to the
    /// experts and the same for every token.
    pub biases: Option<Box<ExpertBiases>>,
    /// Whether the routing weight scales the expert's input rather than its
    /// output (Llama 4; not the same through SwiGLU).
    pub weight_input: bool,
    /// Router ids from here on are identity experts (LongCat-Flash's
    /// "zero-computation" experts): they add `w · x` and nothing is read.
    pub identity_from: Option<usize>,
}

impl Default for ExpertExtras {
    fn default() -> Self {
        Self {
            activation: Activation::Swiglu,
            biases: None,
            weight_input: false,
            identity_from: None,
        }
    }
}

/// Every expert's biases of one layer: `gate_up` is `[E, 2I]` (gate then up
/// for each expert), `down` is `[E, H]`.
#[derive(Debug, Clone)]
pub struct ExpertBiases {
    pub gate_up: Vec<f32>,
    pub down: Vec<f32>,
}

impl ExpertBiases {
    fn of(&self, expert: usize, intermediate2: usize, hidden: usize) -> Option<ExpertBias<'_>> {
        Some(ExpertBias {
            gate_up: self
                .gate_up
                .get(expert * intermediate2..(expert + 1) * intermediate2)?,
            down: self.down.get(expert * hidden..(expert + 1) * hidden)?,
        })
    }
}

/// DeepSeek-V3's MoE, which Kimi K2 and Kimi-Linear keep: sigmoid scores
/// routed within the best groups, a correction bias (`gate.e_score_correction_bias`)
/// that steers the choice only, and shared experts beside the routed ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SigmoidGroupedMoe {
    pub experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub renormalize: bool,
    pub scaling: f64,
    /// Width of one expert; the shared experts are `shared` of them side by side.
    pub intermediate: usize,
    pub shared: usize,
}

impl SigmoidGroupedMoe {
    /// Loads the router, its correction bias and `shared_experts` under `w`.
    pub fn load(&self, w: &Weights, layer: usize, hidden: usize) -> Result<MoeBlock, ModelError> {
        let bias: Vec<f32> = w
            .pp("gate")
            .get("e_score_correction_bias", &[self.experts])?
            .to_vec1()?;
        let shared = match self.shared {
            0 => None,
            n => Some(Mlp::load(
                &w.pp("shared_experts"),
                hidden,
                self.intermediate * n,
            )?),
        };
        let scoring = Scoring::SigmoidGrouped {
            correction_bias: bias,
            n_group: self.n_group,
            topk_group: self.topk_group,
            renormalize: self.renormalize,
            scaling: self.scaling as f32,
        };
        MoeBlock::load(w, layer, hidden, self.experts, self.top_k, scoring, shared)
    }
}

impl MoeBlock {
    /// Loads the router (`gate.weight` under `w`) for `experts` routed experts.
    pub fn load(
        w: &Weights,
        layer: usize,
        hidden: usize,
        experts: usize,
        top_k: usize,
        scoring: Scoring,
        shared: Option<Mlp>,
    ) -> Result<Self, ModelError> {
        let gate = Linear::load(w, "gate", hidden, experts, false)?;
        Ok(Self {
            layer,
            router: Router::new(gate, experts, top_k, scoring),
            shared,
            shared_gate: None,
            extras: ExpertExtras::default(),
        })
    }

    pub fn forward(
        &self,
        x: &Tensor,
        ids: &[u32],
        experts: &dyn ExpertProvider,
    ) -> Result<Tensor, ModelError> {
        let started = self.start(x, ids, experts)?;
        self.finish(started)
    }

    /// Routes the rows of `x` (`[tokens, hidden]`, the tokens `ids`) and
    /// asks for their experts, so the reads are on their way while the
    /// caller does other work.
    pub fn start<'a>(
        &self,
        x: &Tensor,
        ids: &[u32],
        experts: &'a dyn ExpertProvider,
    ) -> Result<Started<'a>, ModelError> {
        let (n, hidden) = x.dims2()?;
        let xs = values(x)?;
        let routes = self.router.route_values(&xs, n, ids)?;
        // expert id → (token rows, weights)
        let mut by_expert: BTreeMap<usize, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
        for (token, route) in routes.iter().enumerate() {
            for &(expert, weight) in route {
                let entry = by_expert.entry(expert).or_default();
                entry.0.push(token);
                entry.1.push(weight);
            }
        }
        let identity = match self.extras.identity_from {
            Some(from) => by_expert.split_off(&from),
            None => BTreeMap::new(),
        };
        let ids: Vec<usize> = by_expert.keys().copied().collect();
        let rows: Vec<u32> = by_expert
            .values()
            .map(|(r, _)| u32::try_from(r.len()).unwrap_or(u32::MAX))
            .collect();
        let stream = experts.fetch(self.layer, &ids, &rows)?;
        Ok(Started {
            xs,
            n,
            hidden,
            by_expert,
            identity,
            stream,
        })
    }

    /// Computes each expert as it arrives, then adds their outputs in
    /// ascending id order (and the shared expert last), whatever the order of
    /// arrival. Experts are computed side by side on the compute threads,
    /// each by one thread: a decode step's eight experts cost one hand-off
    /// instead of sixteen, and each expert's numbers do not depend on which
    /// thread computed it.
    pub fn finish(&self, started: Started<'_>) -> Result<Tensor, ModelError> {
        let Started {
            xs,
            n,
            hidden,
            by_expert,
            identity,
            stream,
        } = started;
        let routes: Vec<ExpertRows<'_>> = by_expert.iter().map(|(&id, r)| (id, r)).collect();
        let slots: Vec<Slot> = routes.iter().map(|_| Mutex::new(None)).collect();
        let mut failed = None;
        rayon::in_place_scope(|scope| {
            for item in stream {
                let (pos, expert) = match item {
                    Ok(arrived) => arrived,
                    Err(e) => {
                        failed = Some(ModelError::from(e));
                        break;
                    }
                };
                let (Some(slot), Some(&(id, (rows, weights)))) = (slots.get(pos), routes.get(pos))
                else {
                    failed = Some(ModelError::Internal("an expert arrived for no request"));
                    break;
                };
                let (xs, extras) = (&xs, &self.extras);
                scope.spawn(move |_| {
                    let y = weighted_output(&expert, id, extras, xs, hidden, rows, weights);
                    if let Ok(mut slot) = slot.lock() {
                        *slot = Some(y);
                    }
                });
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        let mut out = vec![0f32; n * hidden];
        for ((_, (rows, _)), slot) in routes.iter().zip(slots) {
            let y = slot
                .into_inner()
                .ok()
                .flatten()
                .ok_or(ModelError::Internal("an expert never arrived"))??;
            for (&row, part) in rows.iter().zip(y.chunks_exact(hidden.max(1))) {
                for (o, v) in out[row * hidden..(row + 1) * hidden].iter_mut().zip(part) {
                    *o += v;
                }
            }
        }
        // Identity experts after the computed ones, in ascending id order.
        for (rows, weights) in identity.values() {
            for (&row, &w) in rows.iter().zip(weights) {
                let at = row * hidden..(row + 1) * hidden;
                for (o, v) in out[at.clone()].iter_mut().zip(&xs[at]) {
                    *o += w * v;
                }
            }
        }
        if let Some(shared) = &self.shared {
            let mut s = shared.forward_values(&xs, n)?;
            if let Some(gate) = &self.shared_gate {
                let g = gate.forward_values(&xs, n)?;
                for (row, g) in s.chunks_mut(hidden.max(1)).zip(g) {
                    let scale = sigmoid(g);
                    row.iter_mut().for_each(|v| *v *= scale);
                }
            }
            for (o, v) in out.iter_mut().zip(&s) {
                *o += v;
            }
        }
        Ok(Tensor::from_vec(out, (n, hidden), &Device::Cpu)?)
    }

    /// The experts this layer's router picks for the `n` rows of `normed`
    /// (already through the layer's post-attention norm), ascending: the
    /// pilot's guess when `normed` comes from an earlier layer.
    pub fn predict(&self, normed: &[f32], n: usize, ids: &[u32]) -> Result<Vec<usize>, ModelError> {
        let routes = self.router.route_values(normed, n, ids)?;
        let real = |e: &usize| self.extras.identity_from.is_none_or(|from| *e < from);
        let mut ids: Vec<usize> = routes
            .iter()
            .flatten()
            .map(|&(e, _)| e)
            .filter(real)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }
}

/// An expert id with the token rows it serves and their weights.
type ExpertRows<'a> = (usize, &'a (Vec<usize>, Vec<f32>));

/// Where one expert's weighted output lands, from whichever thread computed it.
type Slot = Mutex<Option<Result<Vec<f32>, ModelError>>>;

/// A MoE step under way: rows routed, experts asked for.
pub struct Started<'a> {
    xs: Vec<f32>,
    n: usize,
    hidden: usize,
    /// expert id → (token rows, weights), in ascending id order.
    by_expert: BTreeMap<usize, (Vec<usize>, Vec<f32>)>,
    /// The same for identity experts, which are not read.
    identity: BTreeMap<usize, (Vec<usize>, Vec<f32>)>,
    stream: ExpertStream<'a>,
}

/// One expert applied to the given rows of `x`, each output row scaled by
/// its routing weight (or each input row, with [`ExpertExtras::weight_input`]).
fn weighted_output(
    expert: &Expert,
    id: usize,
    extras: &ExpertExtras,
    x: &[f32],
    hidden: usize,
    rows: &[usize],
    weights: &[f32],
) -> Result<Vec<f32>, ModelError> {
    let mut gathered = Vec::with_capacity(rows.len() * hidden);
    for (&r, &w) in rows.iter().zip(weights) {
        let row = &x[r * hidden..(r + 1) * hidden];
        if extras.weight_input {
            gathered.extend(row.iter().map(|v| v * w));
        } else {
            gathered.extend_from_slice(row);
        }
    }
    let bias = match &extras.biases {
        Some(b) => Some(
            b.of(id, 2 * expert.intermediate(), hidden)
                .ok_or(ModelError::Internal("an expert has no biases"))?,
        ),
        None => None,
    };
    let mut y = expert.forward_with(&gathered, rows.len(), extras.activation, bias)?;
    if !extras.weight_input {
        for (row, &w) in y.chunks_exact_mut(hidden.max(1)).zip(weights) {
            row.iter_mut().for_each(|v| *v *= w);
        }
    }
    Ok(y)
}

/// Released checkpoints name the MoE block `block_sparse_moe`; recent
/// transformers versions write `mlp`.
const MOE_BLOCK_NAMES: [&str; 2] = ["block_sparse_moe", "mlp"];

/// A layer's MoE block under `lw`, by whichever name holds its router.
pub fn moe_block<'a>(lw: &Weights<'a>) -> Weights<'a> {
    let block = MOE_BLOCK_NAMES
        .iter()
        .find(|b| lw.pp(b).has("gate.weight"))
        .copied()
        .unwrap_or(MOE_BLOCK_NAMES[0]);
    lw.pp(block)
}
