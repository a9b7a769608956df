//! DeepSeek-V4's tensors for synthetic checkpoints, in V4-Flash's
//! proportions scaled to the hidden size: two sliding-window layers, then
//! compressed sparse and heavily compressed layers in turn; token-hashed
//! routing on the first three layers; four residual streams.

use serde_json::{Value, json};

use super::{Add, FLOAT_DTYPES, Fill, PROJ_MOE, Shape, SynthAttention, SynthSpec};

/// DeepSeek-V4-Flash's proportions: hyper-connections, compressed and
/// sliding attention, hashed routing first; its layer adds the router's
/// bias or hash table and the shared expert.
pub static SHAPE: Shape = Shape {
    name: "deepseek_v4",
    attention: SynthAttention::Own(layer),
    moe: Some(PROJ_MOE),
    dense_prefix: 0,
    dtypes: FLOAT_DTYPES,
    expert_groups: 1,
    config,
    head: Some(head),
};

/// V4-Flash's settings that do not scale with the model.
const SLIDING_WINDOW: usize = 128;
const INDEX_TOPK: usize = 512;
const CSA_RATE: usize = 4;
const HCA_RATE: usize = 128;
const HC_MULT: usize = 4;
const HASH_LAYERS: usize = 3;
const SLIDING_LAYERS: usize = 2;
const O_GROUPS: usize = 8;

/// Attention sizes derived from the hidden size and heads.
struct Dims {
    head: usize,
    rope: usize,
    q_lora: usize,
    o_groups: usize,
    o_lora: usize,
    index_heads: usize,
    index_dim: usize,
}

impl Dims {
    fn of(s: &SynthSpec) -> Self {
        let head = (2 * s.hidden / s.heads).max(16) & !1;
        let rope = (head / 8).max(2) & !1;
        Self {
            head,
            rope,
            q_lora: (s.hidden / 4).max(8),
            o_groups: O_GROUPS.min(s.heads),
            o_lora: (s.hidden / 4).max(8),
            index_heads: s.heads,
            index_dim: (head / 4).max(rope),
        }
    }
}

fn layer_type(l: usize) -> &'static str {
    if l < SLIDING_LAYERS {
        "sliding_attention"
    } else if l.is_multiple_of(2) {
        "compressed_sparse_attention"
    } else {
        "heavily_compressed_attention"
    }
}

fn config(s: &SynthSpec) -> Value {
    let d = Dims::of(s);
    let types: Vec<&str> = (0..s.layers).map(layer_type).collect();
    json!({
        "model_type": "deepseek_v4",
        "head_dim": d.head, "partial_rotary_factor": d.rope as f64 / d.head as f64,
        "q_lora_rank": d.q_lora, "o_groups": d.o_groups, "o_lora_rank": d.o_lora,
        "moe_intermediate_size": s.moe_intermediate, "n_routed_experts": s.experts,
        "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "scoring_func": "sqrtsoftplus",
        "hc_mult": HC_MULT, "index_n_heads": d.index_heads, "index_head_dim": d.index_dim,
        "index_topk": INDEX_TOPK, "sliding_window": SLIDING_WINDOW,
        "compress_rates": {
            "compressed_sparse_attention": CSA_RATE, "heavily_compressed_attention": HCA_RATE,
        },
        "layer_types": types, "num_hash_layers": HASH_LAYERS.min(s.layers),
        "compress_rope_theta": 160000.0,
    })
}

/// Adds layer `l`'s tensors under `p` (`model.layers.{l}`) through `t`,
/// but for its norms and experts.
fn layer(s: &SynthSpec, p: &str, l: usize, t: &mut Add) {
    let (h, d) = (s.hidden, Dims::of(s));
    let std = |fan_in: usize| Fill::Uniform(1.0 / (fan_in as f32).sqrt());
    let hc = (2 + HC_MULT) * HC_MULT;
    for name in ["attn_hc", "ffn_hc"] {
        t(
            format!("{p}.{name}.fn"),
            vec![hc, HC_MULT * h],
            std(HC_MULT * h),
        );
        t(format!("{p}.{name}.base"), vec![hc], Fill::Zeros);
        t(format!("{p}.{name}.scale"), vec![3], Fill::NearOne);
    }
    let a = format!("{p}.self_attn");
    let heads_width = s.heads * d.head;
    t(format!("{a}.q_a_proj.weight"), vec![d.q_lora, h], std(h));
    t(
        format!("{a}.q_a_norm.weight"),
        vec![d.q_lora],
        Fill::NearOne,
    );
    t(
        format!("{a}.q_b_proj.weight"),
        vec![heads_width, d.q_lora],
        std(d.q_lora),
    );
    t(format!("{a}.kv_proj.weight"), vec![d.head, h], std(h));
    t(format!("{a}.kv_norm.weight"), vec![d.head], Fill::NearOne);
    let group = heads_width / d.o_groups;
    t(
        format!("{a}.o_a_proj.weight"),
        vec![d.o_groups * d.o_lora, group],
        std(group),
    );
    t(
        format!("{a}.o_b_proj.weight"),
        vec![h, d.o_groups * d.o_lora],
        std(d.o_groups * d.o_lora),
    );
    t(format!("{a}.sinks"), vec![s.heads], Fill::Zeros);
    let mut compressor = |prefix: String, dim: usize, rate: usize, overlap: bool| {
        let width = if overlap { 2 * dim } else { dim };
        t(format!("{prefix}.kv_proj.weight"), vec![width, h], std(h));
        t(format!("{prefix}.gate_proj.weight"), vec![width, h], std(h));
        t(
            format!("{prefix}.position_bias"),
            vec![rate, width],
            Fill::Zeros,
        );
        t(format!("{prefix}.kv_norm.weight"), vec![dim], Fill::NearOne);
    };
    match layer_type(l) {
        "compressed_sparse_attention" => {
            compressor(format!("{a}.compressor"), d.head, CSA_RATE, true);
            let ix = format!("{a}.compressor.indexer");
            compressor(ix.clone(), d.index_dim, CSA_RATE, true);
            t(
                format!("{ix}.q_b_proj.weight"),
                vec![d.index_heads * d.index_dim, d.q_lora],
                std(d.q_lora),
            );
            t(
                format!("{ix}.scorer.weights_proj.weight"),
                vec![d.index_heads, h],
                std(h),
            );
        }
        "heavily_compressed_attention" => {
            compressor(format!("{a}.compressor"), d.head, HCA_RATE, false);
        }
        _ => {}
    }
    let m = format!("{p}.mlp");
    if l < HASH_LAYERS {
        t(
            format!("{m}.gate.tid2eid"),
            vec![s.vocab, s.top_k],
            Fill::TokenExperts { experts: s.experts },
        );
    } else {
        t(
            format!("{m}.gate.e_score_correction_bias"),
            vec![s.experts],
            Fill::Zeros,
        );
    }
    let i = s.moe_intermediate;
    t(
        format!("{m}.shared_experts.gate_proj.weight"),
        vec![i, h],
        std(h),
    );
    t(
        format!("{m}.shared_experts.up_proj.weight"),
        vec![i, h],
        std(h),
    );
    t(
        format!("{m}.shared_experts.down_proj.weight"),
        vec![h, i],
        std(i),
    );
}

/// The final collapse of the residual streams.
fn head(s: &SynthSpec, t: &mut Add) {
    let h = s.hidden;
    let std = Fill::Uniform(1.0 / ((HC_MULT * h) as f32).sqrt());
    t(
        "model.hc_head.hc_fn".into(),
        vec![HC_MULT, HC_MULT * h],
        std,
    );
    t("model.hc_head.hc_base".into(), vec![HC_MULT], Fill::Zeros);
    t("model.hc_head.hc_scale".into(), vec![1], Fill::NearOne);
}
