//! How one family's synthetic checkpoint is laid out, as data: its attention,
//! its MoE block's names, leading dense layers, the formats it is released
//! in and its config fields. Families with layers of their own kind (gpt-oss,
//! Kimi-Linear, DeepSeek-V4) name a function for the part that differs.
//! Each family's row in the families' table points at its shape.

use serde_json::Value;

use super::{Fill, MlaDims, SynthDtype, SynthSpec, popularity};

/// Adds one tensor to the plan: name, shape, how its values are drawn.
pub type Add<'a> = dyn FnMut(String, Vec<usize>, Fill) + 'a;

/// A family as `synth --arch` writes it.
pub trait SynthFamily: Sync + std::fmt::Debug {
    /// The `--arch` name (the family's `model_type`).
    fn name(&self) -> &'static str;
    /// Leading layers with a dense MLP instead of experts.
    fn dense_prefix(&self) -> usize;
    /// Refuses what the family is not released as.
    fn check(&self, s: &SynthSpec) -> Result<(), String>;
    /// Layer `l`'s tensors under `p` (`model.layers.L`), its two norms excepted.
    fn layer(&self, s: &SynthSpec, p: &str, l: usize, t: &mut Add);
    /// Tensors outside the layers, the embedding, final norm and head excepted.
    fn head(&self, s: &SynthSpec, t: &mut Add);
    /// The family's own config.json fields.
    fn config(&self, s: &SynthSpec) -> Value;
}

/// q/k norms of grouped-query attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// One weight per head lane (Qwen3).
    PerHead,
    /// One weight per lane of all heads (MiniMax-M2).
    FullWidth,
}

/// A family's attention.
#[derive(Debug, Clone, Copy)]
pub enum SynthAttention {
    Grouped {
        qk_norm: QkNorm,
        /// q/k/v biases (GLM-4.5).
        bias: bool,
    },
    /// Multi-head latent attention, with a lightning indexer or not.
    Latent { indexer: bool },
    /// The family's own layer tensors, MoE's router and experts excepted.
    Own(fn(&SynthSpec, &str, usize, &mut Add)),
}

/// Where a family keeps its router's correction bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterBias {
    None,
    /// `….gate.e_score_correction_bias` (DeepSeek-V3, GLM).
    UnderGate,
    /// `….e_score_correction_bias` under the block (MiniMax-M2).
    UnderBlock,
    /// `….moe_statics.e_score_correction_bias`, `[1, experts]` (ERNIE 4.5).
    MoeStatics,
}

/// A family's MoE block.
#[derive(Debug, Clone, Copy)]
pub struct Moe {
    /// The block's module name (`mlp`, `block_sparse_moe`).
    pub block: &'static str,
    /// Gate, up and down projections' names.
    pub names: [&'static str; 3],
    pub bias: RouterBias,
    pub shared_experts: bool,
}

/// `mlp` with `gate_proj`/`up_proj`/`down_proj`.
pub const PROJ_MOE: Moe = Moe {
    block: "mlp",
    names: ["gate_proj", "up_proj", "down_proj"],
    bias: RouterBias::None,
    shared_experts: false,
};
/// DeepSeek-V3's: correction bias under the gate and shared experts.
pub const DEEPSEEK_MOE: Moe = Moe {
    bias: RouterBias::UnderGate,
    shared_experts: true,
    ..PROJ_MOE
};
/// `block_sparse_moe` with `w1`/`w3`/`w2`.
pub const MIXTRAL_MOE: Moe = Moe {
    block: "block_sparse_moe",
    names: ["w1", "w3", "w2"],
    ..PROJ_MOE
};

/// Every storage `--dtype` synth writes.
pub const ALL_DTYPES: &[SynthDtype] = &[
    SynthDtype::Bf16,
    SynthDtype::F32,
    SynthDtype::Fp8,
    SynthDtype::Int4,
];
/// Plain floats only.
pub const FLOAT_DTYPES: &[SynthDtype] = &[SynthDtype::Bf16, SynthDtype::F32];

/// A family's synthetic layout.
#[derive(Debug)]
pub struct Shape {
    pub name: &'static str,
    pub attention: SynthAttention,
    /// The MoE block, or `None` when [`SynthAttention::Own`] adds the experts too.
    pub moe: Option<Moe>,
    pub dense_prefix: usize,
    /// Formats it is released in.
    pub dtypes: &'static [SynthDtype],
    /// Routing groups the experts split into evenly.
    pub expert_groups: usize,
    pub config: fn(&SynthSpec) -> Value,
    pub head: Option<fn(&SynthSpec, &mut Add)>,
}

impl SynthFamily for Shape {
    fn name(&self) -> &'static str {
        self.name
    }

    fn dense_prefix(&self) -> usize {
        self.dense_prefix
    }

    fn check(&self, s: &SynthSpec) -> Result<(), String> {
        if !self.dtypes.contains(&s.dtype) {
            let names: Vec<&str> = self.dtypes.iter().map(|d| d.name()).collect();
            return Err(format!(
                "--dtype {}: {} is released as {}; use one of those",
                s.dtype.name(),
                self.name,
                names.join(", ")
            ));
        }
        if !s.experts.is_multiple_of(self.expert_groups) {
            return Err(format!(
                "{} needs --experts divisible by {} (its routing groups)",
                self.name, self.expert_groups
            ));
        }
        Ok(())
    }

    fn layer(&self, s: &SynthSpec, p: &str, l: usize, t: &mut Add) {
        let a = format!("{p}.self_attn");
        match self.attention {
            SynthAttention::Grouped { qk_norm, bias } => grouped(s, &a, qk_norm, bias, t),
            SynthAttention::Latent { indexer } => latent(s, &a, indexer, t),
            SynthAttention::Own(layer) => layer(s, p, l, t),
        }
        if l < self.dense_prefix {
            dense_mlp(s, &format!("{p}.mlp"), t);
        } else if let Some(moe) = &self.moe {
            experts(s, p, moe, t);
        }
    }

    fn head(&self, s: &SynthSpec, t: &mut Add) {
        if let Some(head) = self.head {
            head(s, t);
        }
    }

    fn config(&self, s: &SynthSpec) -> Value {
        (self.config)(s)
    }
}

fn std(fan_in: usize) -> Fill {
    Fill::Uniform(1.0 / (fan_in as f32).sqrt())
}

/// q/k/v/o projections of grouped-query attention under `a`.
pub fn grouped(s: &SynthSpec, a: &str, qk_norm: QkNorm, bias: bool, t: &mut Add) {
    let h = s.hidden;
    let head_dim = h / s.heads;
    let (q, kv) = (s.heads * head_dim, s.kv_heads * head_dim);
    for (name, out) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
        t(format!("{a}.{name}.weight"), vec![out, h], std(h));
        if bias {
            t(format!("{a}.{name}.bias"), vec![out], std(h));
        }
    }
    t(format!("{a}.o_proj.weight"), vec![h, q], std(q));
    let norms = match qk_norm {
        QkNorm::None => None,
        QkNorm::PerHead => Some((head_dim, head_dim)),
        QkNorm::FullWidth => Some((q, kv)),
    };
    if let Some((qn, kn)) = norms {
        t(format!("{a}.q_norm.weight"), vec![qn], Fill::NearOne);
        t(format!("{a}.k_norm.weight"), vec![kn], Fill::NearOne);
    }
}

/// Latent attention's key-value path and output under `a`: the shared
/// down-projection to `kv_a` rows (the latent, and the rotary part where
/// the family keeps it there), its norm, the up-projection to every head's
/// keys and values, and `o_proj`. Five families' writers share it.
pub fn latent_kv(s: &SynthSpec, a: &str, kv_a: usize, t: &mut Add) {
    let (h, m) = (s.hidden, MlaDims::of(s));
    t(
        format!("{a}.kv_a_proj_with_mqa.weight"),
        vec![kv_a, h],
        std(h),
    );
    t(
        format!("{a}.kv_a_layernorm.weight"),
        vec![m.kv_lora],
        Fill::NearOne,
    );
    t(
        format!("{a}.kv_b_proj.weight"),
        vec![s.heads * (m.nope + m.v), m.kv_lora],
        std(m.kv_lora),
    );
    t(
        format!("{a}.o_proj.weight"),
        vec![h, s.heads * m.v],
        std(s.heads * m.v),
    );
}

/// Multi-head latent attention under `a` (DeepSeek-V3's proportions), and
/// the lightning indexer of DeepSeek sparse attention.
pub fn latent(s: &SynthSpec, a: &str, indexer: bool, t: &mut Add) {
    let (h, m) = (s.hidden, MlaDims::of(s));
    let qk = m.nope + m.rope;
    t(format!("{a}.q_a_proj.weight"), vec![m.q_lora, h], std(h));
    t(
        format!("{a}.q_a_layernorm.weight"),
        vec![m.q_lora],
        Fill::NearOne,
    );
    t(
        format!("{a}.q_b_proj.weight"),
        vec![s.heads * qk, m.q_lora],
        std(m.q_lora),
    );
    latent_kv(s, a, m.kv_lora + m.rope, t);
    if indexer {
        let (heads, dim) = (m.index_heads, m.index_dim);
        let ix = format!("{a}.indexer");
        t(
            format!("{ix}.wq_b.weight"),
            vec![heads * dim, m.q_lora],
            std(m.q_lora),
        );
        t(format!("{ix}.wk.weight"), vec![dim, h], std(h));
        t(format!("{ix}.k_norm.weight"), vec![dim], Fill::NearOne);
        t(format!("{ix}.k_norm.bias"), vec![dim], Fill::Zeros);
        t(format!("{ix}.weights_proj.weight"), vec![heads, h], std(h));
    }
}

/// A dense SwiGLU MLP under `m`.
pub fn dense_mlp(s: &SynthSpec, m: &str, t: &mut Add) {
    let (h, i) = (s.hidden, s.dense_intermediate);
    t(format!("{m}.gate_proj.weight"), vec![i, h], std(h));
    t(format!("{m}.up_proj.weight"), vec![i, h], std(h));
    t(format!("{m}.down_proj.weight"), vec![h, i], std(i));
}

/// The router (reading the bias channel by popularity), its bias, shared
/// experts and every routed expert of layer `p`'s MoE block.
pub fn experts(s: &SynthSpec, p: &str, moe: &Moe, t: &mut Add) {
    let (h, i) = (s.hidden, s.moe_intermediate);
    let m = format!("{p}.{}", moe.block);
    t(
        format!("{m}.gate.weight"),
        vec![s.experts, h],
        Fill::Router {
            std: 1.0 / (h as f32).sqrt(),
            popularity: popularity(s.experts, s.zipf),
        },
    );
    match moe.bias {
        RouterBias::None => {}
        RouterBias::UnderGate => {
            t(
                format!("{m}.gate.e_score_correction_bias"),
                vec![s.experts],
                Fill::Zeros,
            );
        }
        RouterBias::UnderBlock => {
            t(
                format!("{m}.e_score_correction_bias"),
                vec![s.experts],
                Fill::Zeros,
            );
        }
        RouterBias::MoeStatics => {
            let name = format!("{m}.moe_statics.e_score_correction_bias");
            t(name, vec![1, s.experts], Fill::Zeros);
        }
    }
    if moe.shared_experts {
        let x = format!("{m}.shared_experts");
        t(format!("{x}.gate_proj.weight"), vec![i, h], std(h));
        t(format!("{x}.up_proj.weight"), vec![i, h], std(h));
        t(format!("{x}.down_proj.weight"), vec![h, i], std(i));
    }
    let [gate, up, down] = moe.names;
    for e in 0..s.experts {
        let x = format!("{m}.experts.{e}");
        t(format!("{x}.{gate}.weight"), vec![i, h], std(h));
        t(format!("{x}.{up}.weight"), vec![i, h], std(h));
        t(format!("{x}.{down}.weight"), vec![h, i], std(i));
    }
}
