//! A sparse MoE block: route, fetch the chosen experts, combine.
//!
//! Experts are applied in ascending id order and their outputs added into the
//! result in that order, so the sum is the same whatever order the experts
//! arrived in — one half of the exactness invariant.

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::experts::ExpertProvider;
use super::router::{Router, Scoring};
use super::{Linear, Mlp};
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
        let routes = self.router.route(x)?;
        // expert id → (token rows, weights)
        let mut by_expert: BTreeMap<usize, (Vec<u32>, Vec<f32>)> = BTreeMap::new();
        for (token, route) in routes.iter().enumerate() {
            for &(expert, weight) in route {
                let entry = by_expert.entry(expert).or_default();
                entry.0.push(token as u32);
                entry.1.push(weight);
            }
        }
        // A long prompt can touch every expert of a layer; asking for them in
        // groups of top-k bounds the experts held outside the cache at once.
        let ids: Vec<usize> = by_expert.keys().copied().collect();
        let group = self.router.top_k().max(1);
        let mut out = x.zeros_like()?;
        for chunk in ids.chunks(group) {
            let handles = experts.experts(self.layer, chunk)?;
            for (id, expert) in chunk.iter().zip(handles.iter().map(Arc::as_ref)) {
                let (rows, weights) = &by_expert[id];
                let n = rows.len();
                let rows = Tensor::from_slice(rows, n, &Device::Cpu)?;
                let weights = Tensor::from_slice(weights, (n, 1), &Device::Cpu)?;
                let y = expert
                    .forward(&x.index_select(&rows, 0)?)?
                    .broadcast_mul(&weights)?;
                out = out.index_add(&rows, &y, 0)?;
            }
        }
        if let Some(shared) = &self.shared {
            out = (out + shared.forward(x)?)?;
        }
        Ok(out)
    }
}
