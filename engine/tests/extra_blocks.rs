//! Blocks a release carries beside the decoder (multi-token prediction)
//! never change the answer: a checkpoint with an MTP block gives bitwise the
//! logits of the same checkpoint without it, from its folder and from a pack
//! under any budget, and the pack leaves the block out and says so.

mod common;

use std::path::{Path, PathBuf};

use longhaul_engine::model::ExtraBlock;
use longhaul_engine::pack::{Manifest, PackOptions, write_pack};
use longhaul_engine::weights::SafetensorsFile;
use longhaul_engine::weights::safetensors::{TensorEntry, header_bytes};
use longhaul_engine::{Engine, EngineOptions};

/// A tensor's name and shape.
type Named = (String, Vec<usize>);

/// How a release names its MTP block, given a decoder layer's tensor name
/// suffix (`mlp.experts.3.gate_proj.weight`).
struct MtpLayout {
    fixture: &'static str,
    /// The decoder layer the block's tensors are copied from (a MoE layer).
    from_layer: usize,
    /// The block's name for one of those tensors.
    rename: fn(&str) -> String,
    /// The block's own tensors beside its layer: name and shape.
    own: fn(hidden: usize, vocab: usize) -> Vec<Named>,
}

const LAYOUTS: &[MtpLayout] = &[
    // Qwen3-Next and Qwen3.5: `mtp.*`, one layer with its own routed experts.
    MtpLayout {
        fixture: "qwen3_next_released",
        from_layer: 3,
        rename: |rest| format!("mtp.layers.0.{rest}"),
        own: |h, _| {
            vec![
                ("mtp.fc.weight".into(), vec![h, 2 * h]),
                ("mtp.norm.weight".into(), vec![h]),
                ("mtp.pre_fc_norm_embedding.weight".into(), vec![h]),
                ("mtp.pre_fc_norm_hidden.weight".into(), vec![h]),
            ]
        },
    },
    // DeepSeek-V3 (and V3.2, GLM): a decoder layer past `num_hidden_layers`.
    MtpLayout {
        fixture: "deepseek_v3_released",
        from_layer: 2,
        rename: |rest| format!("model.layers.3.{rest}"),
        own: |h, v| {
            vec![
                ("model.layers.3.eh_proj.weight".into(), vec![h, 2 * h]),
                ("model.layers.3.enorm.weight".into(), vec![h]),
                ("model.layers.3.hnorm.weight".into(), vec![h]),
                ("model.layers.3.shared_head.norm.weight".into(), vec![h]),
                ("model.layers.3.shared_head.head.weight".into(), vec![v, h]),
                ("model.layers.3.embed_tokens.weight".into(), vec![v, h]),
            ]
        },
    },
];

const SINGLE: &str = "model.safetensors";
const FIRST: &str = "model-00001-of-00002.safetensors";
const SECOND: &str = "model-00002-of-00002.safetensors";

/// Copies the fixture into `dir` as two shards, the second holding an MTP
/// block built from one of its decoder layers (so a block mistaken for a
/// layer gives other logits). Returns the block's tensor names.
fn with_mtp_block(layout: &MtpLayout, dir: &Path) -> Vec<String> {
    let src = common::fixtures_dir().join(layout.fixture);
    std::fs::create_dir_all(dir).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let to = if name == SINGLE {
            FIRST.to_string()
        } else {
            name
        };
        std::fs::copy(&path, dir.join(to)).unwrap();
    }
    let file = SafetensorsFile::open(&src.join(SINGLE)).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let (hidden, vocab) = (
        config["hidden_size"].as_u64().unwrap() as usize,
        config["vocab_size"].as_u64().unwrap() as usize,
    );
    assert!(
        (layout.rename)("x").starts_with("mtp.")
            || (layout.rename)("x") == format!("model.layers.{}.x", config["num_hidden_layers"]),
        "a layout names the layer just past the decoder"
    );
    let layer = format!("model.layers.{}.", layout.from_layer);
    let mut tensors: Vec<(String, String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, info) in file.tensors() {
        let Some(rest) = name.strip_prefix(&layer) else {
            continue;
        };
        let bytes = file.read_bytes(info).unwrap();
        tensors.push((
            (layout.rename)(rest),
            info.dtype.name().unwrap().to_string(),
            info.shape.clone(),
            bytes,
        ));
    }
    assert!(
        tensors.iter().any(|t| t.0.contains(".experts.")),
        "the block carries routed experts"
    );
    for (i, (name, shape)) in (layout.own)(hidden, vocab).into_iter().enumerate() {
        let n: usize = shape.iter().product();
        let bytes = (0..n)
            .flat_map(|k| (((k * 7 + i) % 13) as f32 * 0.01).to_le_bytes())
            .collect();
        tensors.push((name, "F32".into(), shape, bytes));
    }
    let entries: Vec<TensorEntry> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| TensorEntry {
            name,
            dtype,
            shape,
            len: bytes.len() as u64,
        })
        .collect();
    let mut out = header_bytes(&entries);
    for t in &tensors {
        out.extend_from_slice(&t.3);
    }
    std::fs::write(dir.join(SECOND), out).unwrap();
    let mut map = serde_json::Map::new();
    for name in file.tensors().keys() {
        map.insert(name.clone(), FIRST.into());
    }
    for t in &tensors {
        map.insert(t.0.clone(), SECOND.into());
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    tensors.into_iter().map(|t| t.0).collect()
}

fn open(path: &Path, budget: u64) -> Engine {
    let mut o = EngineOptions::default();
    o.streaming.budget_bytes = budget;
    Engine::open_with(path, &o, &|_| {}).unwrap()
}

fn logits(engine: &Engine, ids: &[u32]) -> Vec<Vec<f32>> {
    engine.logits(ids).unwrap().to_vec2().unwrap()
}

fn pack(source: &Path, root: &Path) -> PathBuf {
    let drives: Vec<PathBuf> = (0..2).map(|i| root.join(format!("drive{i}"))).collect();
    for d in &drives {
        std::fs::create_dir_all(d).unwrap();
    }
    let out = root.join("pack");
    write_pack(
        &PackOptions::new(source.to_path_buf(), out.clone(), drives),
        &|_| {},
    )
    .unwrap();
    out
}

#[test]
fn an_mtp_block_changes_no_logit_from_the_folder_or_a_pack() {
    for layout in LAYOUTS {
        let tmp = tempfile::tempdir().unwrap();
        let with = tmp.path().join("with-mtp");
        let block = with_mtp_block(layout, &with);
        let ids = common::expected(&common::fixtures_dir().join(layout.fixture)).ids;
        let plain = logits(
            &open(&common::fixtures_dir().join(layout.fixture), u64::MAX),
            &ids,
        );
        assert_eq!(
            logits(&open(&with, u64::MAX), &ids),
            plain,
            "{}: from the folder",
            layout.fixture
        );
        let packed = pack(&with, &tmp.path().join("packed"));
        let manifest: Manifest = serde_json::from_str(
            &std::fs::read_to_string(packed.join(longhaul_engine::pack::MANIFEST_FILE)).unwrap(),
        )
        .unwrap();
        let one_expert = manifest.experts.layers[0].records[0].len;
        for budget in [0, one_expert, u64::MAX] {
            assert_eq!(
                logits(&open(&packed, budget), &ids),
                plain,
                "{}: from a pack, budget {budget}",
                layout.fixture
            );
        }
        let left = &manifest.left_out;
        assert_eq!(left.len(), 1, "{}: {left:?}", layout.fixture);
        assert_eq!(left[0].block, ExtraBlock::Mtp);
        assert_eq!(left[0].tensors, block.len(), "{}", layout.fixture);
        let resident = SafetensorsFile::open(&manifest.resident.path).unwrap();
        for name in &block {
            assert!(
                !resident.tensors().contains_key(name),
                "{}: {name} is in the resident file",
                layout.fixture
            );
        }
        let plain_pack = pack(
            &common::fixtures_dir().join(layout.fixture),
            &tmp.path().join("plain"),
        );
        let plain_manifest: Manifest = serde_json::from_str(
            &std::fs::read_to_string(plain_pack.join(longhaul_engine::pack::MANIFEST_FILE))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            manifest.experts.layers, plain_manifest.experts.layers,
            "{}: the same expert records as without the block",
            layout.fixture
        );
    }
}
