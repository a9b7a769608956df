//! A sparse MoE block: route, fetch the chosen experts, combine.
//!
//! Experts are applied in ascending id order and their outputs added into the
//! result in that order, so the sum is the same whatever order the experts
//! arrived in — one half of the exactness invariant.

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::experts::{Expert, ExpertProvider};
use super::router::{Router, Scoring};
use super::{Linear, Mlp, values};
use crate::model::ModelError;
use crate::weights::Weights;

pub struct MoeBlock {
    /// Decoder layer index, as the expert provider knows it.
    pub layer: usize,
    pub router: Router,
    pub shared: Option<Mlp>,
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
        })
    }

    pub fn forward(&self, x: &Tensor, experts: &dyn ExpertProvider) -> Result<Tensor, ModelError> {
        let (n, hidden) = x.dims2()?;
        let xs = values(x)?;
        let routes = self.router.route_values(&xs, n)?;
        // expert id → (token rows, weights)
        let mut by_expert: BTreeMap<usize, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
        for (token, route) in routes.iter().enumerate() {
            for &(expert, weight) in route {
                let entry = by_expert.entry(expert).or_default();
                entry.0.push(token);
                entry.1.push(weight);
            }
        }
        // A long prompt can touch every expert of a layer; asking for them in
        // groups of top-k bounds the experts held outside the cache at once.
        let ids: Vec<usize> = by_expert.keys().copied().collect();
        let group = self.router.top_k().max(1);
        let mut outputs: Vec<Vec<f32>> = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(group) {
            let handles = experts.experts(self.layer, chunk)?;
            for (id, expert) in chunk.iter().zip(handles.iter().map(Arc::as_ref)) {
                let (rows, weights) = &by_expert[id];
                outputs.push(weighted_output(expert, &xs, hidden, rows, weights)?);
            }
        }
        let mut out = vec![0f32; n * hidden];
        for ((rows, _), y) in by_expert.values().zip(&outputs) {
            for (&row, part) in rows.iter().zip(y.chunks_exact(hidden.max(1))) {
                for (o, v) in out[row * hidden..(row + 1) * hidden].iter_mut().zip(part) {
                    *o += v;
                }
            }
        }
        if let Some(shared) = &self.shared {
            let s = shared.forward_values(&xs, n)?;
            for (o, v) in out.iter_mut().zip(&s) {
                *o += v;
            }
        }
        Ok(Tensor::from_vec(out, (n, hidden), &Device::Cpu)?)
    }
}

/// One expert applied to the given rows of `x`, each output row scaled by
/// its routing weight.
fn weighted_output(
    expert: &Expert,
    x: &[f32],
    hidden: usize,
    rows: &[usize],
    weights: &[f32],
) -> Result<Vec<f32>, ModelError> {
    let mut gathered = Vec::with_capacity(rows.len() * hidden);
    for &r in rows {
        gathered.extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
    }
    let mut y = expert.forward(&gathered, rows.len())?;
    for (row, &w) in y.chunks_exact_mut(hidden.max(1)).zip(weights) {
        row.iter_mut().for_each(|v| *v *= w);
    }
    Ok(y)
}
