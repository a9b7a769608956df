//! DeepSeek-V3.2 and V3.2-Exp (`deepseek_v32`): DeepSeek-V3 with DeepSeek
//! sparse attention — the machinery GLM-5 inherits ([`super::glm_moe_dsa`]):
//! every layer runs its own lightning indexer (64 heads) over the MLA's
//! normed low-rank query and picks the 2,048 positions each query reads.
//! Where V3.2 differs from GLM-5, as transformers 5.24 and the release's
//! own reference compute it: the indexer rotates its first
//! `qk_rope_head_dim` lanes in split halves (not interleaved pairs, which
//! the attention keeps), and DeepSeek-V3's defaults (eight expert groups,
//! four kept, RMS epsilon 1e-6).

use serde_json::json;

use super::deepseek_v3::DEEPSEEK_V3;
use super::family::{Family, Parsed};
use super::glm_moe_dsa::{Config, Variant};
use crate::synth::{self, ALL_DTYPES, DEEPSEEK_MOE, Shape, SynthAttention};

/// `DeepseekV32Config`'s.
pub const DEEPSEEK_V32: Variant = Variant {
    defaults: DEEPSEEK_V3,
    index_heads: 64,
    shared_indexers: false,
    index_rope_interleaved: false,
};

/// DeepSeek-V3.2.
pub static FAMILY: Family = Family {
    types: &["deepseek_v32"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse_with(raw, &DEEPSEEK_V32)?)),
    gguf: &[],
    synth: Some(&SYNTH),
};

/// `synth --arch deepseek_v32`: DeepSeek-V3's shape with an indexer per layer.
static SYNTH: Shape = Shape {
    name: "deepseek_v32",
    attention: SynthAttention::Latent { indexer: true },
    moe: Some(DEEPSEEK_MOE),
    dense_prefix: 1,
    dtypes: ALL_DTYPES,
    expert_groups: 8,
    config: |s| {
        let m = synth::MlaDims::of(s);
        let index = json!({
            "index_topk": synth::SYNTH_INDEX_TOPK, "index_head_dim": m.index_dim,
            "index_n_heads": m.index_heads,
        });
        synth::extended(synth::mla_config(s, "deepseek_v32", (8, 4)), index)
    },
    head: None,
};
