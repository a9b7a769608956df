//! Routed experts stored as stacked `x · W` tensors (`experts.gate_up_proj`
//! `[E, H, 2I]`, `experts.down_proj` `[E, I, H]`), as gpt-oss and Llama 4
//! publish them, turned into Longhaul's records: gate rows, up rows, then
//! down rows, at the stored width. gpt-oss interleaves gate and up (gate
//! on even columns); Llama 4 puts all gate columns before the up ones.
//! gpt-oss's MXFP4 blocks (`_blocks`, `_scales`) and experts stored one by
//! one (a GGUF's layout) read here too. Each stacked tensor is read once per
//! layer; packs write exactly these bytes, and RAM holds the same.

use crate::kernels::{Format, Matrix};
use crate::model::ModelError;
use crate::weights::{TensorSource, Weights, WeightsError, expect_shape, mxfp4, stored_rows};

use super::experts::{Expert, ExpertSetup};

/// How gate and up share a stacked `gate_up_proj`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateUp {
    /// Gate on even columns, up on odd (gpt-oss).
    Interleaved,
    /// Gate on the first half of the columns, up on the second (Llama 4).
    Halves,
}

/// Routed experts stored stacked: what the pack writer needs to read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackedExperts {
    pub count: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub gate_up: GateUp,
}

/// Registers decoder layer `layer`'s stacked experts (`ew`: its
/// `experts`), reading them into RAM when `setup` holds experts there.
pub fn add_layer(
    setup: &mut ExpertSetup,
    ew: &Weights,
    layer: usize,
    s: StackedExperts,
) -> Result<(), ModelError> {
    if let ExpertSetup::Resident(resident) = setup {
        let (h, i) = (s.hidden, s.intermediate);
        let loaded = layer_records(ew, s.count, h, i, s.gate_up)?
            .iter()
            .map(|(format, bytes)| expert(bytes, *format, h, i).map(std::sync::Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        resident.insert_layer(layer, loaded);
    }
    Ok(())
}

/// One expert from its record (gate rows, up rows, down rows).
pub fn expert(
    record: &[u8],
    format: Format,
    hidden: usize,
    inter: usize,
) -> Result<Expert, ModelError> {
    let split = 2 * inter * format.row_bytes(hidden).unwrap_or(0);
    let gate_up = Matrix::from_bytes(
        2 * inter,
        hidden,
        format,
        &record[..split.min(record.len())],
    )?;
    let down = Matrix::from_bytes(hidden, inter, format, &record[split.min(record.len())..])?;
    Expert::new(gate_up, down)
}

/// Every expert of one layer (`ew`: its `mlp.experts`) as a record at its
/// stored width: gate rows, up rows (de-interleaved), then down rows. Each
/// stacked tensor is read once; packs write exactly these bytes.
pub fn layer_records(
    ew: &Weights,
    count: usize,
    hidden: usize,
    inter: usize,
    order: GateUp,
) -> Result<Vec<(Format, Vec<u8>)>, ModelError> {
    let source = ew.source();
    if ew.has("0.gate_proj.weight") {
        return per_expert_records(ew, count, hidden, inter);
    }
    let (gate_up, down) = (ew.full_name("gate_up_proj"), ew.full_name("down_proj"));
    if mxfp4::is_blocked(source, &gate_up) {
        let gu = mxfp4::load(source, &gate_up, &[count, 2 * inter, hidden])?;
        let d = mxfp4::load(source, &down, &[count, hidden, inter])?;
        return Ok(stack_records(
            &gu,
            &d,
            Format::Mxfp4,
            count,
            hidden,
            inter,
            order,
        ));
    }
    // Plain floats, stored `x · W`: transposed to rows of outputs.
    let gu = transposed(source, &gate_up, &[count, hidden, 2 * inter])?;
    let d = transposed(source, &down, &[count, inter, hidden])?;
    let format = gu.0;
    Ok(stack_records(
        &gu.1, &d.1, format, count, hidden, inter, order,
    ))
}

/// Records from experts stored one by one, gate and up apart (a GGUF's
/// layout: llama.cpp's converter de-interleaves and transposes them).
fn per_expert_records(
    ew: &Weights,
    count: usize,
    hidden: usize,
    inter: usize,
) -> Result<Vec<(Format, Vec<u8>)>, ModelError> {
    let source = ew.source();
    (0..count)
        .map(|e| {
            let mut record = Vec::new();
            let mut format = None;
            for (part, shape) in [
                ("gate_proj", [inter, hidden]),
                ("up_proj", [inter, hidden]),
                ("down_proj", [hidden, inter]),
            ] {
                let name = ew.full_name(&format!("{e}.{part}.weight"));
                expect_shape(source, &name, &shape)?;
                let (f, bytes) = stored_rows(source, &name, &shape, 1)?;
                if format.is_some_and(|first| first != f) {
                    return Err(WeightsError::InvalidFile {
                        path: source.location(&name),
                        reason: format!(
                            "expert {e} stores `{part}` as {}, its other matrices otherwise; a gpt-oss expert is one format",
                            f.name()
                        ),
                    }
                    .into());
                }
                format = Some(f);
                record.extend(bytes);
            }
            Ok((format.unwrap_or(Format::F32), record))
        })
        .collect()
}

/// The `[E, K, N]` float stack `name`, each matrix transposed to `[N, K]`.
fn transposed(
    source: &dyn TensorSource,
    name: &str,
    shape: &[usize; 3],
) -> Result<(Format, Vec<u8>), ModelError> {
    expect_shape(source, name, shape)?;
    let (format, bytes) = stored_rows(source, name, shape, shape[0])?;
    let size: usize = match format {
        Format::F32 => 4,
        Format::F16 | Format::BF16 => 2,
        _ => {
            return Err(WeightsError::InvalidFile {
                path: source.location(name),
                reason: format!(
                    "gpt-oss experts `{name}` are stored as {}; they are read as floats or as MXFP4 blocks",
                    format.name()
                ),
            }
            .into());
        }
    };
    let [_, k, n] = *shape;
    let mut out = vec![0u8; bytes.len()];
    for (src, dst) in bytes
        .chunks_exact(k * n * size)
        .zip(out.chunks_exact_mut(k * n * size))
    {
        for row in 0..k {
            for col in 0..n {
                let from = (row * n + col) * size;
                let to = (col * k + row) * size;
                dst[to..to + size].copy_from_slice(&src[from..from + size]);
            }
        }
    }
    Ok((format, out))
}

/// Records from stacks of rows: gate/up `[E, 2I, H]` (in `order`) and down
/// `[E, H, I]`, each row already in `format`.
fn stack_records(
    gate_up: &[u8],
    down: &[u8],
    format: Format,
    count: usize,
    hidden: usize,
    inter: usize,
    order: GateUp,
) -> Vec<(Format, Vec<u8>)> {
    let gu_row = format.row_bytes(hidden).unwrap_or(0);
    let d_len = hidden * format.row_bytes(inter).unwrap_or(0);
    (0..count)
        .map(|e| {
            let rows = &gate_up[e * 2 * inter * gu_row..(e + 1) * 2 * inter * gu_row];
            let mut record = Vec::with_capacity(rows.len() + d_len);
            match order {
                GateUp::Interleaved => {
                    for parity in [0, 1] {
                        for r in (parity..2 * inter).step_by(2) {
                            record.extend_from_slice(&rows[r * gu_row..(r + 1) * gu_row]);
                        }
                    }
                }
                GateUp::Halves => record.extend_from_slice(rows),
            }
            record.extend_from_slice(&down[e * d_len..(e + 1) * d_len]);
            (format, record)
        })
        .collect()
}
