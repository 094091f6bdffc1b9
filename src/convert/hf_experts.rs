//! Hugging Face checkpoints that stack their experts in one tensor per layer (GPT-OSS): each
//! stacked tensor becomes one `.flm` tensor per expert in the `[out, in]` layout every linear
//! has, under the names the MoE stage reads (`{experts}.{e}.{gate_proj|up_proj|down_proj}`).
//!
//! GPT-OSS stores `gate_up_proj` as `[experts, hidden, 2·inner]` (multiplied as `x · W`) with
//! the gate and up columns interleaved (gate at even columns, up at odd ones), its bias as
//! `[experts, 2·inner]` interleaved the same way, and `down_proj` as `[experts, inner, hidden]`
//! with a `[experts, hidden]` bias.
//!
//! Its MXFP4 checkpoints store each expert matrix as a U8 pair: `{proj}_blocks`
//! `[experts, out, in / 32, 16]` (already the `[out, in]` layout; gate at even rows of
//! `gate_up`, up at odd ones) and `{proj}_scales` `[experts, out, in / 32]` (E8M0 exponents).
//! [`split_mxfp4_experts`] repacks a pair into per-expert MXFP4 tensors, bit for bit.

use crate::error::{Error, Result};

/// One per-expert tensor: its `.flm` name, dims and f32 values.
pub struct ExpertTensor {
    /// The `.flm` name.
    pub name: String,
    /// Row-major dims.
    pub dims: Vec<usize>,
    /// The values.
    pub values: Vec<f32>,
}

/// The stacked-expert tensor kinds of GPT-OSS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stacked {
    GateUp,
    GateUpBias,
    Down,
    DownBias,
    /// `gate_up_proj_blocks` (MXFP4; its scales are read with it).
    GateUpBlocks,
    /// `down_proj_blocks`.
    DownBlocks,
    /// `*_scales`: written with their blocks, no tensor of their own.
    Scales,
}

/// The kind and the name prefix (`….mlp.experts`) of a stacked expert tensor of `arch`;
/// `None` for any other tensor; an unknown `_blocks` / `_scales` tensor is refused by name.
fn stacked(arch: &str, name: &str) -> Result<Option<(Stacked, String)>> {
    if arch != "gpt_oss" {
        return Ok(None);
    }
    let Some((prefix, last)) = name.rsplit_once('.') else {
        return Ok(None);
    };
    if !prefix.ends_with(".mlp.experts") {
        return Ok(None);
    }
    let kind = match last {
        "gate_up_proj" => Stacked::GateUp,
        "gate_up_proj_bias" => Stacked::GateUpBias,
        "down_proj" => Stacked::Down,
        "down_proj_bias" => Stacked::DownBias,
        "gate_up_proj_blocks" => Stacked::GateUpBlocks,
        "down_proj_blocks" => Stacked::DownBlocks,
        "gate_up_proj_scales" | "down_proj_scales" => Stacked::Scales,
        other if other.ends_with("_blocks") || other.ends_with("_scales") => {
            return Err(Error::Unsupported(format!(
                "tensor {name}: MXFP4 blocks of an unknown expert projection"
            )))
        }
        _ => return Ok(None),
    };
    Ok(Some((kind, prefix.to_string())))
}

/// How many tensors [`split_experts`] makes of the stacked expert tensor `name` of `dims`
/// (two per expert for the fused gate/up, one for down); `None` for any other tensor.
pub fn stacked_parts(arch: &str, name: &str, dims: &[usize]) -> Result<Option<usize>> {
    Ok(stacked(arch, name)?.map(|(kind, _)| {
        let experts = dims.first().copied().unwrap_or(0);
        match kind {
            Stacked::GateUp | Stacked::GateUpBias | Stacked::GateUpBlocks => 2 * experts,
            Stacked::Down | Stacked::DownBias | Stacked::DownBlocks => experts,
            Stacked::Scales => 0,
        }
    }))
}

/// Splits the stacked expert tensor `name` (`dims`, f32 `values`) of `arch` into per-expert
/// tensors (an error when the shape is not the stacked layout).
pub fn split_experts(
    arch: &str,
    name: &str,
    dims: &[usize],
    values: &[f32],
) -> Result<Vec<ExpertTensor>> {
    let Some((kind, prefix)) = stacked(arch, name)? else {
        return Err(Error::invalid(format!(
            "tensor {name}: not a stacked expert tensor"
        )));
    };
    let bad = |want: &str| {
        Error::invalid(format!(
            "tensor {name}: shape {dims:?} is not the stacked expert layout {want}"
        ))
    };
    let count: usize = dims.iter().product();
    if count != values.len() {
        return Err(bad("(values do not match the shape)"));
    }
    if dims.contains(&0) {
        return Err(bad("(an empty dimension)"));
    }
    let t = |e: usize, part: &str, dims: Vec<usize>, values: Vec<f32>| ExpertTensor {
        name: format!("{prefix}.{e}.{part}"),
        dims,
        values,
    };
    let mut out = Vec::new();
    match (kind, dims) {
        (Stacked::GateUp, &[ne, hidden, two_inner]) if two_inner % 2 == 0 => {
            let inner = two_inner / 2;
            for (e, w) in values.chunks_exact(hidden * two_inner).enumerate().take(ne) {
                // column 2i (gate) / 2i + 1 (up) of [hidden, 2·inner] → row i of [inner, hidden]
                let col = |c: usize| (0..hidden).map(move |h| w[h * two_inner + c]);
                let gate = (0..inner).flat_map(|i| col(2 * i)).collect();
                let up = (0..inner).flat_map(|i| col(2 * i + 1)).collect();
                out.push(t(e, "gate_proj.weight", vec![inner, hidden], gate));
                out.push(t(e, "up_proj.weight", vec![inner, hidden], up));
            }
        }
        (Stacked::GateUpBias, &[_, two_inner]) if two_inner % 2 == 0 => {
            for (e, b) in values.chunks_exact(two_inner).enumerate() {
                let gate = b.iter().step_by(2).copied().collect();
                let up = b.iter().skip(1).step_by(2).copied().collect();
                out.push(t(e, "gate_proj.bias", vec![two_inner / 2], gate));
                out.push(t(e, "up_proj.bias", vec![two_inner / 2], up));
            }
        }
        (Stacked::Down, &[ne, inner, hidden]) => {
            for (e, w) in values.chunks_exact(inner * hidden).enumerate().take(ne) {
                // [inner, hidden] transposed → [hidden, inner]
                let wt = (0..hidden)
                    .flat_map(|h| (0..inner).map(move |i| w[i * hidden + h]))
                    .collect();
                out.push(t(e, "down_proj.weight", vec![hidden, inner], wt));
            }
        }
        (Stacked::DownBias, &[_, hidden]) => {
            for (e, b) in values.chunks_exact(hidden).enumerate() {
                out.push(t(e, "down_proj.bias", vec![hidden], b.to_vec()));
            }
        }
        (Stacked::GateUp, _) => return Err(bad("[experts, hidden, 2·inner]")),
        (Stacked::GateUpBias, _) => return Err(bad("[experts, 2·inner]")),
        (Stacked::Down, _) => return Err(bad("[experts, inner, hidden]")),
        (Stacked::DownBias, _) => return Err(bad("[experts, hidden]")),
        (Stacked::GateUpBlocks | Stacked::DownBlocks | Stacked::Scales, _) => {
            return Err(bad("(MXFP4 blocks are split by split_mxfp4_experts)"))
        }
    }
    Ok(out)
}

/// One per-expert MXFP4 tensor: its `.flm` name, dims `[out, in]` and blocks.
pub struct ExpertBlocks {
    /// The `.flm` name.
    pub name: String,
    /// `[out, in]`.
    pub dims: Vec<usize>,
    /// MXFP4 blocks (layout in `fastllm_cpu::mxfp4`), row by row.
    pub bytes: Vec<u8>,
}

/// The `_scales` tensor that goes with the `_blocks` tensor `name` (`None` for other names).
pub fn scales_name(name: &str) -> Option<String> {
    name.strip_suffix("_blocks").map(|s| format!("{s}_scales"))
}

/// True for an MXFP4 `_scales` tensor of `arch`, which [`split_mxfp4_experts`] reads with its
/// blocks.
pub fn is_mxfp4_scales(arch: &str, name: &str) -> Result<bool> {
    Ok(matches!(stacked(arch, name)?, Some((Stacked::Scales, _))))
}

/// True for an MXFP4 `_blocks` tensor of `arch` ([`split_mxfp4_experts`]).
pub fn is_mxfp4_blocks(arch: &str, name: &str) -> Result<bool> {
    Ok(matches!(
        stacked(arch, name)?,
        Some((Stacked::GateUpBlocks | Stacked::DownBlocks, _))
    ))
}

/// Repacks the MXFP4 pair `name` (`_blocks`, U8 `[experts, out, groups, 16]`) and its scales
/// (U8 `[experts, out, groups]`) of `arch` into per-expert MXFP4 tensors `[out, groups·32]`
/// (gate/up split from the even/odd rows of `gate_up`); an error names the tensor when the
/// shapes do not fit or a scale is the NaN exponent.
pub fn split_mxfp4_experts(
    arch: &str,
    name: &str,
    dims: &[usize],
    blocks: &[u8],
    scale_dims: &[usize],
    scales: &[u8],
) -> Result<Vec<ExpertBlocks>> {
    use fastllm_cpu::mxfp4::{check_blocks, mxfp4_from_hf, MXFP4_BYTES};
    let kind = match stacked(arch, name)? {
        Some((k @ (Stacked::GateUpBlocks | Stacked::DownBlocks), prefix)) => (k, prefix),
        _ => {
            return Err(Error::invalid(format!(
                "tensor {name}: not MXFP4 expert blocks"
            )))
        }
    };
    let (kind, prefix) = kind;
    let &[ne, rows, groups, 16] = dims else {
        return Err(Error::invalid(format!(
            "tensor {name}: shape {dims:?} is not the MXFP4 layout [experts, out, in / 32, 16]"
        )));
    };
    let count = ne * rows * groups;
    if scale_dims != [ne, rows, groups] || blocks.len() != count * 16 || scales.len() != count {
        return Err(Error::invalid(format!(
            "tensor {name}: blocks {dims:?} and scales {scale_dims:?} do not pair up (scales \
             must be [{ne}, {rows}, {groups}])"
        )));
    }
    if count == 0 || (kind == Stacked::GateUpBlocks && rows % 2 != 0) {
        return Err(Error::invalid(format!(
            "tensor {name}: shape {dims:?} has no rows to split into experts"
        )));
    }
    let mut all = vec![0u8; count * MXFP4_BYTES];
    mxfp4_from_hf(blocks, scales, &mut all);
    check_blocks(&all).map_err(|e| Error::invalid(format!("tensor {name}: {e}")))?;
    let rb = groups * MXFP4_BYTES;
    let k = groups * fastllm_cpu::quant::QK;
    let mut out = Vec::new();
    for (e, w) in all.chunks_exact(rows * rb).enumerate() {
        let t = |part: &str, rows: Vec<&[u8]>| ExpertBlocks {
            name: format!("{prefix}.{e}.{part}"),
            dims: vec![rows.len(), k],
            bytes: rows.concat(),
        };
        let row_list: Vec<&[u8]> = w.chunks_exact(rb).collect();
        if kind == Stacked::GateUpBlocks {
            out.push(t(
                "gate_proj.weight",
                row_list.iter().step_by(2).copied().collect(),
            ));
            out.push(t(
                "up_proj.weight",
                row_list.iter().skip(1).step_by(2).copied().collect(),
            ));
        } else {
            out.push(t("down_proj.weight", row_list));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_up_columns_deinterleave_and_transpose() {
        // 1 expert, hidden 2, inner 2: columns g0 u0 g1 u1
        let w = [1., 2., 3., 4., 5., 6., 7., 8.];
        let p = split_experts(
            "gpt_oss",
            "model.layers.0.mlp.experts.gate_up_proj",
            &[1, 2, 4],
            &w,
        )
        .unwrap();
        assert_eq!(p[0].name, "model.layers.0.mlp.experts.0.gate_proj.weight");
        assert_eq!(p[0].dims, [2, 2]);
        assert_eq!(p[0].values, [1., 5., 3., 7.]);
        assert_eq!(p[1].values, [2., 6., 4., 8.]);
        let b = split_experts(
            "gpt_oss",
            "m.mlp.experts.gate_up_proj_bias",
            &[2, 2],
            &w[..4],
        )
        .unwrap();
        assert_eq!(b.len(), 4);
        assert_eq!(
            (b[2].name.as_str(), &b[2].values[..]),
            ("m.mlp.experts.1.gate_proj.bias", &[3.][..])
        );
        let d = split_experts("gpt_oss", "m.mlp.experts.down_proj", &[1, 2, 3], &w[..6]).unwrap();
        assert_eq!(d[0].dims, [3, 2]);
        assert_eq!(d[0].values, [1., 4., 2., 5., 3., 6.]);
    }

    #[test]
    fn other_tensors_and_bad_shapes() {
        let parts = |a: &str, n: &str| stacked_parts(a, n, &[4, 2, 8]);
        assert_eq!(parts("gpt_oss", "m.mlp.router.weight").unwrap(), None);
        assert_eq!(parts("mixtral", "m.mlp.experts.down_proj").unwrap(), None);
        assert_eq!(
            parts("gpt_oss", "m.mlp.experts.down_proj").unwrap(),
            Some(4)
        );
        assert_eq!(
            parts("gpt_oss", "m.mlp.experts.gate_up_proj").unwrap(),
            Some(8)
        );
        let e = parts("gpt_oss", "m.mlp.experts.o_proj_blocks").unwrap_err();
        assert!(e.to_string().contains("MXFP4"), "{e}");
        assert_eq!(
            parts("gpt_oss", "m.mlp.experts.gate_up_proj_blocks").unwrap(),
            Some(8)
        );
        assert_eq!(
            parts("gpt_oss", "m.mlp.experts.gate_up_proj_scales").unwrap(),
            Some(0)
        );
        let e = split_experts(
            "gpt_oss",
            "m.mlp.experts.gate_up_proj",
            &[1, 2, 3],
            &[0.; 6],
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("[experts, hidden, 2·inner]"), "{e}");
        let e = split_experts("gpt_oss", "m.mlp.experts.down_proj", &[2, 0, 3], &[])
            .err()
            .unwrap();
        assert!(e.to_string().contains("empty"), "{e}");
    }

    #[test]
    fn mxfp4_pairs_split_into_expert_rows() {
        // 2 experts, 4 rows (gate/up interleaved), 2 groups of 32
        let blocks: Vec<u8> = (0..2 * 4 * 2 * 16).map(|i| (i * 7 + 3) as u8).collect();
        let scales: Vec<u8> = (0..2 * 4 * 2).map(|i| 100 + i as u8).collect();
        let n = "m.mlp.experts.gate_up_proj_blocks";
        let p = split_mxfp4_experts("gpt_oss", n, &[2, 4, 2, 16], &blocks, &[2, 4, 2], &scales)
            .unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(p[3].name, "m.mlp.experts.1.up_proj.weight");
        assert_eq!(p[3].dims, [2, 64]);
        // expert 1, up row 1 = stacked row 3 of expert 1: its first block's scale
        assert_eq!(p[3].bytes[2 * 17], scales[(4 + 3) * 2]);
        assert_eq!(p[2].bytes[0], scales[4 * 2]);
        let e = split_mxfp4_experts("gpt_oss", n, &[2, 4, 2, 16], &blocks, &[2, 4, 1], &scales)
            .err()
            .unwrap();
        assert!(e.to_string().contains(n), "{e}");
        let mut nan = scales.clone();
        nan[5] = 0xFF;
        let e = split_mxfp4_experts("gpt_oss", n, &[2, 4, 2, 16], &blocks, &[2, 4, 2], &nan)
            .err()
            .unwrap();
        assert!(e.to_string().contains("NaN"), "{e}");
    }
}
