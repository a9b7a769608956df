//! How far one model's predictions are from another's on the same text: the
//! quality report for a quantised pack against the checkpoint it came from.
//!
//! Logit differences alone overstate harm (a shift of every logit changes
//! nothing), so the report leads with what changes predictions: the KL
//! divergence of the next-token distributions, how often the top choice
//! agrees, and each model's perplexity on the text itself.

use crate::kernels::math::{exp, ln};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QualityReport {
    /// Positions compared.
    pub positions: usize,
    /// Mean KL(reference ‖ candidate) of the next-token distributions, in nats.
    pub mean_kl: f64,
    pub max_kl: f64,
    /// Share of positions where both models rank the same token first.
    pub top1_agreement: f64,
    /// Perplexity of each model on the text (positions that have a next token).
    pub reference_perplexity: f64,
    pub candidate_perplexity: f64,
    pub max_abs_logit_diff: f64,
}

/// `log softmax` of one row, in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&x| exp(x as f64 - max)).sum();
    let log_sum = ln(sum) + max;
    row.iter().map(|&x| x as f64 - log_sum).collect()
}

fn argmax(row: &[f32]) -> Option<usize> {
    row.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
}

/// Compares two models' logits for the token sequence `ids` (one row per
/// position, row `p` predicting `ids[p + 1]`). Rows beyond the shorter of the
/// two are ignored; rows of different widths are not comparable.
pub fn compare_logits(
    reference: &[Vec<f32>],
    candidate: &[Vec<f32>],
    ids: &[u32],
) -> Option<QualityReport> {
    let positions = reference.len().min(candidate.len());
    if positions == 0 {
        return None;
    }
    let (mut kl_sum, mut max_kl, mut agree, mut max_diff) = (0.0, 0.0f64, 0usize, 0.0f64);
    let (mut nll_ref, mut nll_cand, mut scored) = (0.0, 0.0, 0usize);
    for p in 0..positions {
        let (r, c) = (&reference[p], &candidate[p]);
        if r.len() != c.len() || r.is_empty() {
            return None;
        }
        let (lr, lc) = (log_softmax(r), log_softmax(c));
        let kl: f64 = lr.iter().zip(&lc).map(|(a, b)| exp(*a) * (a - b)).sum();
        kl_sum += kl;
        max_kl = max_kl.max(kl);
        agree += usize::from(argmax(r) == argmax(c));
        let diff = r
            .iter()
            .zip(c)
            .map(|(a, b)| (a - b).abs() as f64)
            .fold(0.0, f64::max);
        max_diff = max_diff.max(diff);
        if let Some(&next) = ids.get(p + 1).filter(|&&n| (n as usize) < r.len()) {
            nll_ref -= lr[next as usize];
            nll_cand -= lc[next as usize];
            scored += 1;
        }
    }
    let ppl = |nll: f64| {
        if scored > 0 {
            exp(nll / scored as f64)
        } else {
            f64::NAN
        }
    };
    Some(QualityReport {
        positions,
        mean_kl: kl_sum / positions as f64,
        max_kl,
        top1_agreement: agree as f64 / positions as f64,
        reference_perplexity: ppl(nll_ref),
        candidate_perplexity: ppl(nll_cand),
        max_abs_logit_diff: max_diff,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_or_shifted_logits_are_the_same_prediction() {
        let rows = vec![vec![1.0, 2.0, 3.0], vec![0.5, 0.0, -1.0]];
        let shifted: Vec<Vec<f32>> = rows
            .iter()
            .map(|r| r.iter().map(|x| x + 4.0).collect())
            .collect();
        let r = compare_logits(&rows, &shifted, &[0, 2, 0]).unwrap();
        assert!(r.mean_kl.abs() < 1e-9);
        assert_eq!(r.top1_agreement, 1.0);
        assert!((r.reference_perplexity - r.candidate_perplexity).abs() < 1e-9);
        assert!((r.max_abs_logit_diff - 4.0).abs() < 1e-6);
    }

    #[test]
    fn a_changed_prediction_shows_in_kl_agreement_and_perplexity() {
        let reference = vec![vec![5.0, 0.0, 0.0]];
        let candidate = vec![vec![0.0, 5.0, 0.0]];
        let r = compare_logits(&reference, &candidate, &[1, 0]).unwrap();
        assert!(r.mean_kl > 4.0);
        assert_eq!(r.top1_agreement, 0.0);
        // The text continues with token 0, which the reference expects.
        assert!(r.reference_perplexity < 1.1);
        assert!(r.candidate_perplexity > 100.0);
    }

    #[test]
    fn mismatched_vocabularies_are_not_compared() {
        assert!(compare_logits(&[vec![1.0, 2.0]], &[vec![1.0]], &[0]).is_none());
        assert!(compare_logits(&[], &[], &[]).is_none());
    }
}
