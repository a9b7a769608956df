//! How one layer's routed experts are read from a checkpoint into records:
//! gate rows, up rows, then down rows, at the width the checkpoint stores
//! them (plain floats, FP8 or INT4 with their scales, MXFP4 blocks).
//! gpt-oss and Llama 4 store their experts stacked and transposed; their
//! records come from the models' own loader ([`stacked`]), so a pack holds
//! exactly what RAM holds.

use super::PackError;
use super::encoding::ExpertEncoding;
use super::layout::{LayerTensors, Part};
use crate::kernels::Format;
use crate::model::ModelSpec;
use crate::model::layers::stacked::{self, GateUp, StackedExperts};
use crate::weights::safetensors::UnsupportedDtype;
use crate::weights::{Dtype, SafetensorsCheckpoint, Weights, fp4, int4, mxfp4, stored_rows};

/// How one layer's experts are read from the checkpoint.
pub(super) struct LayerPlan<'a> {
    pub(super) layer: usize,
    pub(super) count: usize,
    pub(super) hidden: usize,
    pub(super) intermediate: usize,
    pub(super) encoding: ExpertEncoding,
    pub(super) record_len: u64,
    tensors: &'a LayerTensors,
    /// A stacked layout (transposed or MXFP4), with how gate and up share it.
    stacked: Option<GateUp>,
}

impl<'a> LayerPlan<'a> {
    pub(super) fn new(
        ckpt: &SafetensorsCheckpoint,
        layer: usize,
        tensors: &'a LayerTensors,
        spec: &ModelSpec,
    ) -> Result<Self, PackError> {
        // A family's own stacked layout; experts stored one by one (a GGUF)
        // take the common path.
        if let (Some(s), [Some(_), _]) = (spec.config.stacked_experts(), &tensors.fused) {
            return Self::stacked(ckpt, layer, tensors, s);
        }
        let info = |name: &str| {
            ckpt.info(name)
                .map(|(_, i)| i.clone())
                .ok_or_else(|| PackError::Source(format!("tensor `{name}` is listed but missing")))
        };
        let bad = |reason: String| PackError::Source(format!("layer {layer}: {reason}"));
        let (count, hidden, intermediate, encoding) = if let [Some(gate), Some(up), Some(down)] =
            &tensors.stacks
        {
            let (g, u, d) = (info(gate)?, info(up)?, info(down)?);
            match (g.shape.as_slice(), d.shape.as_slice()) {
                ([e, i, h], [e2, h2, i2])
                    if e == e2
                        && h == h2
                        && i == i2
                        && g.shape == u.shape
                        && g.dtype == u.dtype
                        && g.dtype == d.dtype
                        && !matches!(g.dtype, Dtype::F8E4M3) =>
                {
                    (*e, *h, *i, ExpertEncoding::Plain(g.dtype))
                }
                _ => {
                    return Err(bad(format!(
                        "expert stacks {gate} {:?}, {up} {:?} and {down} {:?} do not fit together (or are not plain floats)",
                        g.shape, u.shape, d.shape
                    )));
                }
            }
        } else if let [Some(gate_up), Some(down)] = &tensors.fused {
            let (gu, d) = (info(gate_up)?, info(down)?);
            match (gu.shape.as_slice(), d.shape.as_slice()) {
                _ if gu.dtype == Dtype::F8E4M3 => {
                    return Err(bad(format!(
                        "FP8 experts in the fused layout ({gate_up}) are not packed; FP8 experts are packed from per-expert tensors, as published"
                    )));
                }
                // A gate/up stack may hold more experts than down's (LongCat's
                // identity experts): the first are the computed ones.
                ([e, two_i, h], [e2, h2, i])
                    if e >= e2 && h == h2 && *two_i == 2 * i && gu.dtype == d.dtype =>
                {
                    (*e2, *h, *i, ExpertEncoding::Plain(gu.dtype))
                }
                _ => {
                    return Err(bad(format!(
                        "fused expert shapes {:?} and {:?} do not fit together",
                        gu.shape, d.shape
                    )));
                }
            }
        } else {
            let count = tensors.per_expert.len();
            if tensors.per_expert.keys().copied().ne(0..count) {
                return Err(bad("expert ids are not 0..N".to_string()));
            }
            let first = tensors
                .per_expert
                .get(&0)
                .ok_or_else(|| bad("no experts".to_string()))?;
            let part = |p: Part, what: &str| {
                first[p as usize]
                    .as_deref()
                    .ok_or_else(|| bad(format!("expert 0 has no {what}")))
            };
            let gate = part(Part::Gate, "gate")?;
            let (shape, encoding) = matrix_info(ckpt, gate)?;
            let [i, h] = shape[..] else {
                return Err(bad(format!("gate shape {shape:?} is not 2-D")));
            };
            let encoding = match encoding {
                ExpertEncoding::Gguf { gate_up, .. } => {
                    let (_, up) = matrix_info(ckpt, part(Part::Up, "up")?)?;
                    let (_, down) = matrix_info(ckpt, part(Part::Down, "down")?)?;
                    match (up, down) {
                        (
                            ExpertEncoding::Gguf { gate_up: u, .. },
                            ExpertEncoding::Gguf { down, .. },
                        ) if u == gate_up => ExpertEncoding::Gguf { gate_up, down },
                        _ => {
                            return Err(bad(format!(
                                "experts store gate as {} but up as {} and down as {}; gate and up must share a GGML block type",
                                encoding.name(),
                                up.name(),
                                down.name()
                            )));
                        }
                    }
                }
                e => e,
            };
            (count, h, i, encoding)
        };
        Ok(Self {
            layer,
            count,
            hidden,
            intermediate,
            encoding,
            record_len: encoding.record_len(hidden, intermediate),
            tensors,
            stacked: None,
        })
    }

    fn stacked(
        ckpt: &SafetensorsCheckpoint,
        layer: usize,
        tensors: &'a LayerTensors,
        s: StackedExperts,
    ) -> Result<Self, PackError> {
        let [Some(gate_up), Some(_)] = &tensors.fused else {
            return Err(PackError::Source(format!(
                "layer {layer}: experts are stacked (`experts.gate_up_proj`, `down_proj`), but these are not"
            )));
        };
        let encoding = if mxfp4::is_blocked(ckpt, gate_up) {
            ExpertEncoding::Published(Format::Mxfp4)
        } else {
            let (_, info) = ckpt.info(gate_up).ok_or_else(|| {
                PackError::Source(format!("tensor `{gate_up}` is listed but missing"))
            })?;
            ExpertEncoding::Plain(info.dtype)
        };
        let (hidden, intermediate) = (s.hidden, s.intermediate);
        Ok(Self {
            layer,
            count: s.count,
            hidden,
            intermediate,
            encoding,
            record_len: encoding.record_len(hidden, intermediate),
            tensors,
            stacked: Some(s.gate_up),
        })
    }

    /// Every record of the layer at once, where the checkpoint stacks its
    /// experts in a layout that must be rearranged (gpt-oss, Llama 4): each
    /// stacked tensor is then read once per layer, not once per expert.
    pub(super) fn layer_records(
        &self,
        ckpt: &SafetensorsCheckpoint,
    ) -> Result<Option<Vec<Vec<u8>>>, PackError> {
        let (Some(gate_up), Some(order)) = (self.tensors.fused[0].as_deref(), self.stacked) else {
            return Ok(None);
        };
        let prefix = gate_up.trim_end_matches(".gate_up_proj");
        let ew = Weights::root(ckpt).pp(prefix);
        let records =
            stacked::layer_records(&ew, self.count, self.hidden, self.intermediate, order)
                .map_err(|e| PackError::Source(format!("layer {}: {e}", self.layer)))?;
        Ok(Some(records.into_iter().map(|(_, bytes)| bytes).collect()))
    }

    /// Gate rows, up rows, then down, at the checkpoint's own width.
    pub(super) fn record_bytes(
        &self,
        ckpt: &SafetensorsCheckpoint,
        expert: usize,
    ) -> Result<Vec<u8>, PackError> {
        let (h, i) = (self.hidden, self.intermediate);
        let source = |e: crate::weights::WeightsError| PackError::Source(e.to_string());
        let lookup = |name: &str| {
            ckpt.info(name)
                .ok_or_else(|| PackError::Source(format!("tensor `{name}` is listed but missing")))
        };
        let mut out = Vec::with_capacity(self.record_len as usize);
        if let ([Some(gate), Some(up), Some(down)], ExpertEncoding::Plain(dtype)) =
            (&self.tensors.stacks, self.encoding)
        {
            let part_len = (h * i) as u64 * dtype.size();
            for name in [gate, up, down] {
                let (f, info) = lookup(name)?;
                out.extend(
                    f.read_range(info, expert as u64 * part_len, part_len)
                        .map_err(source)?,
                );
            }
        } else if let [Some(gate_up), Some(down)] = &self.tensors.fused {
            let ExpertEncoding::Plain(dtype) = self.encoding else {
                return Err(PackError::Source(format!(
                    "layer {}: quantised experts in the fused layout ({gate_up}) are not packed",
                    self.layer
                )));
            };
            let part_len = (h * i) as u64 * dtype.size();
            let (f, info) = lookup(gate_up)?;
            out.extend(
                f.read_range(info, expert as u64 * 2 * part_len, 2 * part_len)
                    .map_err(source)?,
            );
            let (f, info) = lookup(down)?;
            out.extend(
                f.read_range(info, expert as u64 * part_len, part_len)
                    .map_err(source)?,
            );
        } else {
            let names = self.tensors.per_expert.get(&expert).ok_or_else(|| {
                PackError::Source(format!("layer {}: expert {expert} is missing", self.layer))
            })?;
            let expected = [vec![i, h], vec![i, h], vec![h, i]];
            for (k, (slot, want)) in names.iter().zip(expected).enumerate() {
                let name = slot.as_deref().ok_or_else(|| {
                    PackError::Source(format!(
                        "layer {}: expert {expert} lacks a projection",
                        self.layer
                    ))
                })?;
                let (shape, encoding) = matrix_info(ckpt, name)?;
                if shape != want || !self.fits(encoding, k == Part::Down as usize) {
                    return Err(PackError::Source(format!(
                        "tensor `{name}` is {} {shape:?}; the layer's other experts are {} {want:?}",
                        encoding.name(),
                        self.encoding.name()
                    )));
                }
                let (_, bytes) = stored_rows(ckpt, name, &want, 1).map_err(source)?;
                out.extend(bytes);
            }
        }
        Ok(out)
    }
}

impl LayerPlan<'_> {
    /// Whether one matrix stored as `encoding` belongs in this layer's
    /// records: the same encoding, or for GGUF blocks the same type as the
    /// layer's gate/up (or down) matrices.
    fn fits(&self, encoding: ExpertEncoding, down: bool) -> bool {
        match (self.encoding, encoding) {
            (
                ExpertEncoding::Gguf { gate_up, down: d },
                ExpertEncoding::Gguf { gate_up: f, .. },
            ) => f == if down { d } else { gate_up },
            (layer, one) => layer == one,
        }
    }
}

/// The shape of matrix `name` and how the pack will store it: INT4
/// matrices are found by their packed part (`name_packed`).
fn matrix_info(
    ckpt: &SafetensorsCheckpoint,
    name: &str,
) -> Result<(Vec<usize>, ExpertEncoding), PackError> {
    if let Some((_, info)) = ckpt.info(name) {
        // DeepSeek-V4's FP4: two values a byte, the logical shape twice as wide.
        if info.dtype == Dtype::Unsupported(UnsupportedDtype::I8) {
            let shape = fp4::logical_shape(&info.shape);
            if fp4::is_packed(ckpt, name, &shape) {
                return Ok((shape, ExpertEncoding::Published(Format::Mxfp4)));
            }
        }
        let encoding = match info.dtype {
            Dtype::F8E4M3 => ExpertEncoding::Published(Format::Fp8Block),
            // A GGUF's blocks; the layer's plan pairs gate/up with down.
            Dtype::Blocks(f) => ExpertEncoding::Gguf {
                gate_up: f,
                down: f,
            },
            d => ExpertEncoding::Plain(d),
        };
        return Ok((info.shape.clone(), encoding));
    }
    let [packed, ..] = int4::parts(name);
    match ckpt.info(&packed) {
        Some((_, info)) if !info.shape.is_empty() => {
            let mut shape = info.shape.clone();
            let last = shape.len() - 1;
            shape[last] *= int4::PER_WORD;
            Ok((shape, ExpertEncoding::Published(Format::Int4G32)))
        }
        _ => Err(PackError::Source(format!(
            "tensor `{name}` is listed but missing"
        ))),
    }
}
