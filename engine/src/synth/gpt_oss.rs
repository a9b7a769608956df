//! gpt-oss's tensors for synthetic checkpoints: attention with biases and
//! sinks, a biased router, and expert stacks as released (MXFP4 blocks with
//! E8M0 scales) or as `save_pretrained` writes them (`[E, H, 2I]` floats).

use serde_json::{Value, json};

use super::{Add, Fill, Shape, SynthAttention, SynthDtype, SynthSpec, popularity};

/// gpt-oss as released (MXFP4 experts) or as `save_pretrained` writes it.
pub static SHAPE: Shape = Shape {
    name: "gpt_oss",
    attention: SynthAttention::Own(own_layer),
    moe: None,
    dense_prefix: 0,
    dtypes: &[SynthDtype::Mxfp4, SynthDtype::Bf16, SynthDtype::F32],
    expert_groups: 1,
    config,
    head: None,
};

fn own_layer(s: &SynthSpec, p: &str, _l: usize, t: &mut Add) {
    layer(s, p, t);
}

fn config(s: &SynthSpec) -> Value {
    json!({
        "model_type": "gpt_oss",
        "head_dim": s.hidden / s.heads,
        "intermediate_size": s.moe_intermediate, "num_local_experts": s.experts,
        "attention_bias": true, "sliding_window": 128,
        "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
        "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096,
        },
    })
}

/// Adds layer `p`'s attention and MoE tensors (its norms are added by the
/// caller) through `t`.
fn layer(s: &SynthSpec, p: &str, t: &mut Add) {
    let (h, i, e) = (s.hidden, s.moe_intermediate, s.experts);
    let head_dim = h / s.heads;
    let std = |fan_in: usize| Fill::Uniform(1.0 / (fan_in as f32).sqrt());
    let a = format!("{p}.self_attn");
    for (name, out) in [
        ("q_proj", s.heads * head_dim),
        ("k_proj", s.kv_heads * head_dim),
        ("v_proj", s.kv_heads * head_dim),
    ] {
        t(format!("{a}.{name}.weight"), vec![out, h], std(h));
        t(format!("{a}.{name}.bias"), vec![out], Fill::Zeros);
    }
    t(
        format!("{a}.o_proj.weight"),
        vec![h, s.heads * head_dim],
        std(s.heads * head_dim),
    );
    t(format!("{a}.o_proj.bias"), vec![h], Fill::Zeros);
    t(format!("{a}.sinks"), vec![s.heads], Fill::Zeros);
    let m = format!("{p}.mlp");
    t(
        format!("{m}.router.weight"),
        vec![e, h],
        Fill::Router {
            std: 1.0 / (h as f32).sqrt(),
            popularity: popularity(e, s.zipf),
        },
    );
    t(format!("{m}.router.bias"), vec![e], Fill::Zeros);
    let x = format!("{m}.experts");
    if s.dtype == SynthDtype::Mxfp4 {
        // Output rows, blocks along the reduction, as released.
        let group = crate::kernels::format::MXFP4_BLOCK;
        for (name, rows, cols) in [("gate_up_proj", 2 * i, h), ("down_proj", h, i)] {
            t(format!("{x}.{name}_blocks"), vec![e, rows, cols], std(cols));
            let exponent = mxfp4_exponent(1.0 / (cols as f32).sqrt());
            t(
                format!("{x}.{name}_scales"),
                vec![e, rows, cols / group],
                Fill::Constant(exponent),
            );
        }
    } else {
        t(format!("{x}.gate_up_proj"), vec![e, h, 2 * i], std(h));
        t(format!("{x}.down_proj"), vec![e, i, h], std(i));
    }
    t(
        format!("{x}.gate_up_proj_bias"),
        vec![e, 2 * i],
        Fill::Zeros,
    );
    t(format!("{x}.down_proj_bias"), vec![e, h], Fill::Zeros);
}

/// Largest E2M1 magnitude.
const E2M1_MAX: f32 = 6.0;
/// E8M0's exponent bias.
const E8M0_BIAS: f32 = 127.0;

/// The E8M0 scale byte (as a value) whose power of two fits uniform values
/// of standard deviation `std` into ±6.
pub(super) fn mxfp4_exponent(std: f32) -> f32 {
    let largest = std * 3f32.sqrt();
    ((largest / E2M1_MAX).log2().ceil() + E8M0_BIAS).clamp(1.0, 254.0)
}

/// The E2M1 code nearest `x` (ties to the smaller magnitude).
pub(super) fn e2m1_code(x: f32) -> u8 {
    const UPPER: [f32; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
    let m = x.abs();
    let magnitude = UPPER.iter().take_while(|&&u| m > u).count() as u8;
    if x < 0.0 { magnitude | 8 } else { magnitude }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_nearest_e2m1_values() {
        let values = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for (code, v) in values.iter().enumerate() {
            assert_eq!(e2m1_code(*v), code as u8);
            assert_eq!(e2m1_code(-*v - 0.01) & 7, code as u8);
        }
        assert_eq!(e2m1_code(9.0), 7, "clamped to 6");
        assert_eq!(e2m1_code(-0.6), 9);
        assert_eq!(mxfp4_exponent(6.0 / 3f32.sqrt()), 127.0);
    }
}
