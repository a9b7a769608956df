//! Kimi-Linear's tensors for synthetic checkpoints, named as the release
//! names them: Kimi Delta Attention on three layers of four (its q/k/v
//! convolutions apart, the forget gate's tensors in the attention), MLA
//! without rotary on every fourth, and `block_sparse_moe` experts
//! (`w1`/`w3`/`w2`) with a shared expert. At `--experts 256 --top-k 8` this is
//! Kimi K3's kind of model (mostly linear layers, hundreds of experts, a
//! shared expert) scaled to one machine.

use serde_json::{Value, json};

use super::{
    Add, FLOAT_DTYPES, Fill, MIXTRAL_MOE, Moe, RouterBias, Shape, SynthAttention, SynthSpec,
};

/// Kimi-Linear as released: `block_sparse_moe` with the bias under its gate
/// and a shared expert, one dense layer first.
pub static SHAPE: Shape = Shape {
    name: "kimi_linear",
    attention: SynthAttention::Own(own_attention),
    moe: Some(Moe {
        bias: RouterBias::UnderGate,
        shared_experts: true,
        ..MIXTRAL_MOE
    }),
    dense_prefix: 1,
    dtypes: FLOAT_DTYPES,
    expert_groups: 1,
    config,
    head: None,
};

fn own_attention(s: &SynthSpec, p: &str, l: usize, t: &mut Add) {
    attention(s, &format!("{p}.self_attn"), l, t);
}

/// Short convolution taps, as Kimi-Linear ships.
const CONV_KERNEL: usize = 4;
/// One layer in this many is MLA; the others are KDA.
pub(super) const FULL_ATTENTION_EVERY: usize = 4;
/// Kimi-Linear's routed scaling factor.
const ROUTED_SCALING: f64 = 2.446;

/// Whether layer `l` (0-based) uses MLA.
pub(super) fn is_full_attention(l: usize) -> bool {
    (l + 1).is_multiple_of(FULL_ATTENTION_EVERY)
}

/// Linear heads and their size: the attention heads, each `hidden / heads` wide.
fn linear_dims(s: &SynthSpec) -> (usize, usize) {
    (s.heads, s.hidden / s.heads)
}

/// Adds layer `l`'s attention tensors under `a` through `t`.
fn attention(s: &SynthSpec, a: &str, l: usize, t: &mut Add) {
    let h = s.hidden;
    let std = |fan_in: usize| Fill::Uniform(1.0 / (fan_in as f32).sqrt());
    if is_full_attention(l) {
        let m = super::MlaDims::of(s);
        let qk = m.nope + m.rope;
        t(format!("{a}.q_proj.weight"), vec![s.heads * qk, h], std(h));
        super::latent_kv(s, a, m.kv_lora + m.rope, t);
        return;
    }
    let (heads, d) = linear_dims(s);
    let width = heads * d;
    for name in ["q", "k", "v"] {
        t(format!("{a}.{name}_proj.weight"), vec![width, h], std(h));
        t(
            format!("{a}.{name}_conv1d.weight"),
            vec![width, 1, CONV_KERNEL],
            std(CONV_KERNEL),
        );
    }
    t(format!("{a}.f_a_proj.weight"), vec![d, h], std(h));
    t(format!("{a}.f_b_proj.weight"), vec![width, d], std(d));
    t(format!("{a}.dt_bias"), vec![width], Fill::Zeros);
    // Stored `[1, 1, heads, 1]`, as the release and transformers hold it.
    t(format!("{a}.A_log"), vec![1, 1, heads, 1], Fill::NearOne);
    t(format!("{a}.b_proj.weight"), vec![heads, h], std(h));
    t(format!("{a}.g_a_proj.weight"), vec![d, h], std(h));
    t(format!("{a}.g_b_proj.weight"), vec![width, d], std(d));
    t(format!("{a}.o_norm.weight"), vec![d], Fill::NearOne);
    t(format!("{a}.o_proj.weight"), vec![h, width], std(width));
}

/// The config's Kimi-Linear fields.
fn config(s: &SynthSpec) -> Value {
    let m = super::MlaDims::of(s);
    let (heads, d) = linear_dims(s);
    let (full, kda): (Vec<usize>, Vec<usize>) =
        (1..=s.layers).partition(|&l| is_full_attention(l - 1));
    json!({
        "model_type": "kimi_linear",
        // Kimi-Linear's defaults name ids of its 163,840-token vocabulary.
        "pad_token_id": null, "bos_token_id": null, "eos_token_id": null,
        "q_lora_rank": null, "kv_lora_rank": m.kv_lora,
        "qk_nope_head_dim": m.nope, "qk_rope_head_dim": m.rope, "v_head_dim": m.v,
        "intermediate_size": s.dense_intermediate, "moe_intermediate_size": s.moe_intermediate,
        "num_experts": s.experts, "num_experts_per_token": s.top_k, "num_shared_experts": 1,
        "num_expert_group": 1, "topk_group": 1, "moe_renormalize": true,
        "routed_scaling_factor": ROUTED_SCALING, "first_k_dense_replace": 1,
        "linear_attn_config": {
            "head_dim": d, "num_heads": heads, "short_conv_kernel_size": CONV_KERNEL,
            "kda_layers": kda, "full_attn_layers": full,
        },
    })
}
