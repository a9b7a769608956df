//! Choosing experts. Routing runs on plain f32 vectors: it is tiny next to the
//! expert matmuls, and exact control over top-k and tie order is what keeps
//! the chosen experts identical to the reference.

use super::Linear;
use crate::kernels::math::{sigmoid, softmax, softplus};
use crate::model::ModelError;

/// How router logits become expert weights.
#[derive(Debug, Clone)]
pub enum Scoring {
    /// Softmax over all experts, then top-k (Qwen3-MoE, Mixtral); optionally
    /// renormalised so the chosen weights sum to one.
    Softmax { renormalize: bool },
    /// gpt-oss: top-k of the raw logits, then a softmax over those k.
    TopKSoftmax,
    /// Llama 4: top-k of the raw logits, each weighted by its own sigmoid.
    TopKSigmoid,
    /// DeepSeek-V3 / Kimi K2: sigmoid scores; a per-expert bias steers the
    /// choice only; experts are chosen within the best `topk_group` of
    /// `n_group` groups; weights are optionally renormalised, then scaled.
    SigmoidGrouped {
        correction_bias: Vec<f32>,
        n_group: usize,
        topk_group: usize,
        renormalize: bool,
        scaling: f32,
    },
    /// ERNIE 4.5, LongCat-Flash: softmax over all experts; a per-expert
    /// bias steers the choice only; with `norm_min`, the chosen weights are
    /// divided by their sum (at least `norm_min`); then scaled.
    SoftmaxBiased {
        correction_bias: Vec<f32>,
        norm_min: Option<f32>,
        scaling: f32,
    },
    /// DeepSeek-V4: `sqrt(softplus(logit))` scores; a per-expert bias steers
    /// the choice only; the chosen weights are renormalised, then scaled.
    SqrtSoftplus {
        correction_bias: Vec<f32>,
        scaling: f32,
    },
    /// DeepSeek-V4's first layers: the experts are a fixed function of the
    /// token (`tid2eid`, `[vocab][top_k]`); the scores still weigh them.
    Hash { table: Vec<u32>, scaling: f32 },
}

/// One token's chosen experts and their weights, in selection order.
pub type Route = Vec<(usize, f32)>;

#[derive(Debug, Clone)]
pub struct Router {
    gate: Linear,
    experts: usize,
    top_k: usize,
    scoring: Scoring,
}

/// Added to the renormalisation denominator, as in the reference.
const SIGMOID_NORM_EPS: f32 = 1e-20;

impl Router {
    pub fn new(gate: Linear, experts: usize, top_k: usize, scoring: Scoring) -> Self {
        Self {
            gate,
            experts,
            top_k,
            scoring,
        }
    }

    /// Experts chosen per token.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Routes the `n` rows of `x` (`n × hidden`), tokens `ids`.
    pub fn route_values(&self, x: &[f32], n: usize, ids: &[u32]) -> Result<Vec<Route>, ModelError> {
        let logits = self.gate.forward_values(x, n)?;
        logits
            .chunks_exact(self.experts.max(1))
            .enumerate()
            .map(|(row, l)| self.route_one(l, ids.get(row).copied()))
            .collect()
    }

    fn route_one(&self, logits: &[f32], id: Option<u32>) -> Result<Route, ModelError> {
        Ok(match &self.scoring {
            Scoring::Softmax { renormalize } => {
                let probs = softmax(logits);
                let chosen = top_k(&probs, self.top_k);
                let mut route: Route = chosen.into_iter().map(|e| (e, probs[e])).collect();
                if *renormalize {
                    let sum: f32 = route.iter().map(|(_, w)| w).sum();
                    route.iter_mut().for_each(|(_, w)| *w /= sum);
                }
                route
            }
            Scoring::TopKSoftmax => {
                let chosen = top_k(logits, self.top_k);
                let picked: Vec<f32> = chosen.iter().map(|&e| logits[e]).collect();
                chosen.into_iter().zip(softmax(&picked)).collect()
            }
            Scoring::TopKSigmoid => top_k(logits, self.top_k)
                .into_iter()
                .map(|e| (e, sigmoid(logits[e])))
                .collect(),
            Scoring::SigmoidGrouped {
                correction_bias,
                n_group,
                topk_group,
                renormalize,
                scaling,
            } => {
                let scores: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
                let mut choice: Vec<f32> = scores
                    .iter()
                    .zip(correction_bias)
                    .map(|(s, b)| s + b)
                    .collect();
                let per_group = self.experts / n_group;
                // A group's score is the sum of its two best experts.
                let group_scores: Vec<f32> = choice
                    .chunks(per_group)
                    .map(|g| top_k(g, 2.min(g.len())).iter().map(|&i| g[i]).sum())
                    .collect();
                let kept = top_k(&group_scores, *topk_group);
                for (g, chunk) in choice.chunks_mut(per_group).enumerate() {
                    if !kept.contains(&g) {
                        chunk.fill(f32::NEG_INFINITY);
                    }
                }
                let chosen = top_k(&choice, self.top_k);
                let mut route: Route = chosen.into_iter().map(|e| (e, scores[e])).collect();
                if *renormalize {
                    let sum: f32 = route.iter().map(|(_, w)| w).sum::<f32>() + SIGMOID_NORM_EPS;
                    route.iter_mut().for_each(|(_, w)| *w /= sum);
                }
                route.iter_mut().for_each(|(_, w)| *w *= scaling);
                route
            }
            Scoring::SoftmaxBiased {
                correction_bias,
                norm_min,
                scaling,
            } => {
                let probs = softmax(logits);
                let choice: Vec<f32> = probs
                    .iter()
                    .zip(correction_bias)
                    .map(|(p, b)| p + b)
                    .collect();
                let mut route: Route = top_k(&choice, self.top_k)
                    .into_iter()
                    .map(|e| (e, probs[e]))
                    .collect();
                if let Some(min) = norm_min {
                    let sum = route.iter().map(|(_, w)| w).sum::<f32>().max(*min);
                    route.iter_mut().for_each(|(_, w)| *w /= sum);
                }
                route.iter_mut().for_each(|(_, w)| *w *= scaling);
                route
            }
            Scoring::SqrtSoftplus {
                correction_bias,
                scaling,
            } => {
                let scores: Vec<f32> = logits.iter().map(|&l| softplus(l).sqrt()).collect();
                let choice: Vec<f32> = scores
                    .iter()
                    .zip(correction_bias)
                    .map(|(s, b)| s + b)
                    .collect();
                let chosen = top_k(&choice, self.top_k);
                renormalised(chosen, &scores, *scaling)
            }
            Scoring::Hash { table, scaling } => {
                let id = id.ok_or(ModelError::Internal("hash routing without token ids"))? as usize;
                let chosen = table
                    .get(id * self.top_k..(id + 1) * self.top_k)
                    .ok_or(ModelError::Internal("a token past the routing table"))?;
                let scores: Vec<f32> = logits.iter().map(|&l| softplus(l).sqrt()).collect();
                renormalised(
                    chosen.iter().map(|&e| e as usize).collect(),
                    &scores,
                    *scaling,
                )
            }
        })
    }
}

/// The chosen experts weighted by their scores, renormalised, then scaled.
fn renormalised(chosen: Vec<usize>, scores: &[f32], scaling: f32) -> Route {
    let mut route: Route = chosen.into_iter().map(|e| (e, scores[e])).collect();
    let sum: f32 = route.iter().map(|(_, w)| w).sum::<f32>() + SIGMOID_NORM_EPS;
    route.iter_mut().for_each(|(_, w)| *w = *w / sum * scaling);
    route
}

/// Indices of the `k` largest values, largest first; ties go to the lower index.
pub fn top_k(values: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

#[cfg(test)]
// Inputs and references for the tests, not answers: std's functions do.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn router(scoring: Scoring, experts: usize, top_k: usize) -> Router {
        let gate = Linear::from_tensor(
            &candle_core::Tensor::eye(experts, candle_core::DType::F32, &Device::Cpu).unwrap(),
        )
        .unwrap();
        Router::new(gate, experts, top_k, scoring)
    }

    #[test]
    fn top_k_orders_by_value_then_index() {
        assert_eq!(top_k(&[0.1, 0.5, 0.5, 0.2], 3), vec![1, 2, 3]);
    }

    #[test]
    fn softmax_routing_renormalises_chosen_weights() {
        let r = router(Scoring::Softmax { renormalize: true }, 4, 2);
        let route = r.route_one(&[1.0, 3.0, 2.0, 0.0], None).unwrap();
        assert_eq!(route.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2]);
        let sum: f32 = route.iter().map(|r| r.1).sum();
        assert!((sum - 1.0).abs() < 1e-6);
    }

    #[test]
    fn a_softmax_bias_steers_the_choice_but_not_the_weights() {
        let scoring = |norm_min| Scoring::SoftmaxBiased {
            correction_bias: vec![0.0, 0.0, 0.0, 0.9],
            norm_min,
            scaling: 2.0,
        };
        let logits = [1.0, 3.0, 2.0, 0.0];
        let probs = softmax(&logits);
        let route = router(scoring(None), 4, 2)
            .route_one(&logits, None)
            .unwrap();
        assert_eq!(route, vec![(3, probs[3] * 2.0), (1, probs[1] * 2.0)]);
        let route = router(scoring(Some(1e-12)), 4, 2)
            .route_one(&logits, None)
            .unwrap();
        let sum = probs[3] + probs[1];
        assert_eq!(
            route,
            vec![(3, probs[3] / sum * 2.0), (1, probs[1] / sum * 2.0)]
        );
    }

    #[test]
    fn top_k_softmax_routing_weighs_only_the_chosen_logits() {
        let r = router(Scoring::TopKSoftmax, 4, 2);
        let route = r.route_one(&[1.0, 3.0, 2.0, 0.0], None).unwrap();
        assert_eq!(route.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2]);
        let e = (-1f32).exp();
        assert!((route[0].1 - 1.0 / (1.0 + e)).abs() < 1e-7);
        assert!((route[1].1 - e / (1.0 + e)).abs() < 1e-7);
    }

    #[test]
    fn grouped_routing_only_picks_from_kept_groups_and_bias_steers_choice_only() {
        let scoring = Scoring::SigmoidGrouped {
            correction_bias: vec![0.0, 0.0, 0.0, 5.0],
            n_group: 2,
            topk_group: 1,
            renormalize: false,
            scaling: 1.0,
        };
        let r = router(scoring, 4, 2);
        // Group 1 (experts 2, 3) wins thanks to expert 3's bias.
        let route = r.route_one(&[4.0, 4.0, -1.0, -2.0], None).unwrap();
        assert_eq!(route.iter().map(|r| r.0).collect::<Vec<_>>(), vec![3, 2]);
        assert!(
            (route[0].1 - sigmoid(-2.0)).abs() < 1e-7,
            "weights come from unbiased scores"
        );
    }
}
