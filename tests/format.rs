//! `.flm` writer/reader round trips (every dtype, both load modes, zero-copy views), corrupt-file
//! handling (every malformed input is an `Err` naming the file), and the safetensors reader's
//! header validation.

use fastllm::data::{encode_from_f32, Data, DataType, Storage};
use fastllm::format::flm::{FlmFile, FlmWriter, LoadMode, MetaValue, Metadata, ALIGN};
use fastllm::format::safetensors::SafetensorsFile;
use fastllm::model::{ModelConfig, RopeScaling, RopeStyle};
use fastllm::tokenizer::{
    AddedToken, NormalizerKind, PreTokenizerKind, TokenizerKind, TokenizerSpec,
};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-format-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn config() -> ModelConfig {
    ModelConfig {
        architecture: "llama".into(),
        vocab_size: 6,
        hidden_size: 64,
        intermediate_size: 128,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        context_length: 256,
        norm_eps: 1e-5,
        rope_theta: 500000.0,
        rope_dim: 16,
        rope_style: RopeStyle::Neox,
        rope_scaling: RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context_length: 64,
        },
        rope_local_theta: 10000.0,
        tie_embeddings: true,
        hidden_act: "silu".into(),
        attn_logit_softcap: 50.0,
        final_logit_softcap: 30.0,
        sliding_window: 32,
        sliding_layers: vec![true, false],
        query_pre_attn_scalar: 256.0,
        bos_id: Some(1),
        eos_ids: vec![2, 5],
        moe: None,
        mla: None,
    }
}

fn tokenizer() -> TokenizerSpec {
    TokenizerSpec {
        kind: TokenizerKind::SentencePieceBpe,
        vocab: vec![
            b"<unk>".to_vec(),
            b"<s>".to_vec(),
            b"</s>".to_vec(),
            "▁a".as_bytes().to_vec(),
            vec![0xff, 0x00, 0x80],
            b"<|im_end|>".to_vec(),
        ],
        scores: vec![0.0, 0.0, 0.0, -1.5, -2.25, 0.0],
        merges: vec![("▁".as_bytes().to_vec(), b"a".to_vec())],
        added: vec![AddedToken {
            id: 5,
            content: "<|im_end|>".into(),
            special: true,
        }],
        pre_tokenizer: PreTokenizerKind::None,
        normalizer: NormalizerKind::SentencePiece,
        add_prefix_space: true,
        byte_fallback: true,
        bos_id: Some(1),
        eos_ids: vec![2, 5],
        unk_id: Some(0),
        pad_id: None,
        add_bos: true,
        add_eos: false,
    }
}

fn extra_meta() -> Metadata {
    let mut m = Metadata::new();
    m.insert(
        "chat_template".into(),
        MetaValue::Str("{{ messages }}".into()),
    );
    m.insert("generation.temperature".into(), MetaValue::F64(0.7));
    m.insert("generation.top_k".into(), MetaValue::I64(-1));
    m.insert("generation.do_sample".into(), MetaValue::Bool(true));
    m.insert(
        "generation.stop".into(),
        MetaValue::Array(vec![MetaValue::Str("a".into()), MetaValue::Str("b".into())]),
    );
    m
}

/// One tensor per dtype, with reproducible contents.
fn sample_tensors() -> Vec<(String, DataType, Vec<usize>, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut out = Vec::new();
    for (i, dt) in DataType::ALL.iter().copied().enumerate() {
        // rows of whole blocks (256 elements for the K-quants)
        let dims = vec![3 + i, dt.block_elems().max(64)];
        let values: Vec<f32> = (0..dims[0] * dims[1])
            .map(|_| rng.gen_range(-2.0..2.0))
            .collect();
        let values: Vec<f32> = if dt == DataType::I32 {
            values.iter().map(|v| (v * 1000.0).round()).collect()
        } else {
            values
        };
        out.push((
            format!("t.{}", dt.name()),
            dt,
            dims,
            encode_from_f32(dt, &values).unwrap(),
        ));
    }
    out.push((
        "scalarish".into(),
        DataType::F32,
        vec![5],
        encode_from_f32(DataType::F32, &[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap(),
    ));
    out
}

fn write_sample(path: &Path) -> Vec<(String, DataType, Vec<usize>, Vec<u8>)> {
    let tensors = sample_tensors();
    let mut w = FlmWriter::create(path, &config(), &extra_meta(), &tokenizer()).unwrap();
    for (n, dt, dims, b) in &tensors {
        w.add_tensor(n, *dt, dims, b).unwrap();
    }
    w.finish().unwrap();
    tensors
}

#[test]
fn round_trip_every_dtype_both_modes() {
    let path = tmp("roundtrip.flm");
    let tensors = write_sample(&path);
    for mode in [LoadMode::Mmap, LoadMode::LowMemory] {
        let f = FlmFile::open(&path, mode).unwrap();
        assert_eq!(f.config(), &config());
        assert_eq!(f.tokenizer_spec(), &tokenizer());
        assert_eq!(f.chat_template(), Some("{{ messages }}"));
        assert_eq!(
            f.metadata().get("generation.top_k"),
            Some(&MetaValue::I64(-1))
        );
        assert_eq!(
            f.metadata().get("generation.temperature"),
            Some(&MetaValue::F64(0.7))
        );
        assert_eq!(f.tensor_names().count(), tensors.len());
        for (n, dt, dims, bytes) in &tensors {
            assert!(f.has_tensor(n));
            let info = f.tensor_info(n).unwrap();
            assert_eq!((info.dtype, &info.dims), (*dt, dims));
            assert_eq!(info.offset % ALIGN, 0);
            let d = f.tensor(n).unwrap();
            assert_eq!(d.dtype(), *dt);
            assert_eq!(d.dims(), &dims[..]);
            assert_eq!(d.bytes().unwrap(), &bytes[..], "{n} in {mode:?}");
            assert_eq!(d.name, *n);
            let want = Data::from_bytes(*dt, dims, bytes)
                .unwrap()
                .to_f32_vec()
                .unwrap();
            assert_eq!(d.to_f32_vec().unwrap(), want);
        }
        assert!(!f.has_tensor("nope"));
        let err = f.tensor("nope").unwrap_err().to_string();
        assert!(
            err.contains("nope") && err.contains(path.to_str().unwrap()),
            "{err}"
        );
        f.verify().unwrap();
    }
}

#[test]
fn mmap_tensors_are_zero_copy_and_low_memory_copies() {
    let path = tmp("zerocopy.flm");
    write_sample(&path);
    let f = FlmFile::open(&path, LoadMode::Mmap).unwrap();
    let map = f.mapped_bytes().unwrap();
    let range = map.as_ptr() as usize..map.as_ptr() as usize + map.len();
    for n in f.tensor_names() {
        let d = f.tensor(n).unwrap();
        assert!(
            matches!(d.storage(), Storage::Shared { .. }),
            "{n} is not a shared view"
        );
        let p = d.bytes().unwrap().as_ptr() as usize;
        assert!(range.contains(&p), "{n} does not point into the mapping");
        assert_eq!(p % 64, 0, "{n} not 64-byte aligned");
    }
    let low = FlmFile::open(&path, LoadMode::LowMemory).unwrap();
    assert!(low.mapped_bytes().is_none());
    let a = low.tensor("t.q4_1").unwrap();
    let b = low.tensor("t.q4_1").unwrap();
    assert!(matches!(a.storage(), Storage::Owned { .. }));
    assert_ne!(
        a.bytes().unwrap().as_ptr(),
        b.bytes().unwrap().as_ptr(),
        "each call is a fresh read"
    );
    assert_eq!(
        a.bytes().unwrap(),
        f.tensor("t.q4_1").unwrap().bytes().unwrap()
    );
}

// ---- corrupt files ----------------------------------------------------------------------

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// (kind, offset, length) of every section, from the header layout of docs/flm-format.md.
fn sections(b: &[u8]) -> Vec<(u32, usize, usize, usize)> {
    let n = u32::from_le_bytes(b[24..28].try_into().unwrap()) as usize;
    (0..n)
        .map(|i| {
            let e = 32 + 32 * i;
            let kind = u32::from_le_bytes(b[e..e + 4].try_into().unwrap());
            (
                kind,
                u64_at(b, e + 8) as usize,
                u64_at(b, e + 16) as usize,
                e,
            )
        })
        .collect()
}

/// Recomputes the section crcs (metadata, tokenizer, index) and the header crc after an edit.
fn fix_crcs(b: &mut [u8]) {
    let secs = sections(b);
    for (kind, off, len, entry) in &secs {
        if *kind != 4 && off.checked_add(*len).is_some_and(|e| e <= b.len()) {
            let crc = crc32fast::hash(&b[*off..*off + *len]);
            b[entry + 24..entry + 28].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let hlen = 32 + 32 * secs.len();
    let crc = crc32fast::hash(&b[..hlen]);
    b[hlen..hlen + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Offset of the first index entry's dtype field (the first tensor is `t.f32`, 2-D).
fn first_entry(b: &[u8]) -> usize {
    let (_, off, _, _) = sections(b).into_iter().find(|s| s.0 == 3).unwrap();
    // varint count (1 byte), varint name length (1 byte), name
    let name_len = b[off + 1] as usize;
    off + 2 + name_len
}

fn open_err(name: &str, bytes: &[u8], mode: LoadMode) -> String {
    let p = tmp(name);
    std::fs::write(&p, bytes).unwrap();
    let e = match FlmFile::open(&p, mode) {
        Ok(_) => panic!("{name}: corrupt file opened"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains(p.to_str().unwrap()),
        "{name}: error does not name the file: {e}"
    );
    e
}

fn good_bytes(tag: &str) -> Vec<u8> {
    let p = tmp(&format!("good-{tag}.flm"));
    write_sample(&p);
    std::fs::read(&p).unwrap()
}

#[test]
fn truncated_files_are_errors() {
    let good = good_bytes("g1");
    for cut in [0, 7, 20, 40, good.len() / 2, good.len() - 1] {
        for mode in [LoadMode::Mmap, LoadMode::LowMemory] {
            let e = open_err(&format!("trunc{cut}.flm"), &good[..cut], mode);
            assert!(e.contains("truncated"), "{e}");
        }
    }
}

#[test]
fn wrong_magic_and_future_version() {
    let mut b = good_bytes("g2");
    b[0] = b'G';
    let e = open_err("magic.flm", &b, LoadMode::Mmap);
    assert!(e.contains("wrong magic"), "{e}");

    let mut b = good_bytes("g3");
    b[8..10].copy_from_slice(&2u16.to_le_bytes());
    let e = open_err("future.flm", &b, LoadMode::Mmap);
    assert!(e.contains("unsupported .flm version 2.0"), "{e}");

    // a newer minor is accepted
    let mut b = good_bytes("g4");
    b[10..12].copy_from_slice(&7u16.to_le_bytes());
    fix_crcs(&mut b);
    let p = tmp("minor.flm");
    std::fs::write(&p, &b).unwrap();
    assert_eq!(FlmFile::open(&p, LoadMode::Mmap).unwrap().version(), (1, 7));
}

#[test]
fn bad_index_entries() {
    let good = good_bytes("g5");
    let at = first_entry(&good);
    // layout from `at`: u32 dtype, u8 ndims (2), 2 × u64 dims, u64 offset, u64 length, u32 crc
    let mut b = good.clone();
    b[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    fix_crcs(&mut b);
    let e = open_err("dtype.flm", &b, LoadMode::Mmap);
    assert!(e.contains("unknown dtype code 99"), "{e}");

    let mut b = good.clone();
    b[at + 5..at + 13].copy_from_slice(&(1u64 << 62).to_le_bytes());
    b[at + 13..at + 21].copy_from_slice(&(1u64 << 40).to_le_bytes());
    fix_crcs(&mut b);
    let e = open_err("overflow.flm", &b, LoadMode::LowMemory);
    assert!(e.contains("overflow"), "{e}");

    let mut b = good.clone();
    b[at + 21..at + 29].copy_from_slice(&(good.len() as u64 + 64).to_le_bytes());
    fix_crcs(&mut b);
    let e = open_err("offset.flm", &b, LoadMode::Mmap);
    assert!(e.contains("outside"), "{e}");

    let mut b = good.clone();
    b[at + 29..at + 37].copy_from_slice(&7u64.to_le_bytes());
    fix_crcs(&mut b);
    let e = open_err("length.flm", &b, LoadMode::Mmap);
    assert!(e.contains("needs"), "{e}");

    let mut b = good.clone();
    b[at + 4] = 200;
    fix_crcs(&mut b);
    let e = open_err("ndims.flm", &b, LoadMode::Mmap);
    assert!(e.contains("dims"), "{e}");
}

#[test]
fn section_outside_the_file() {
    let mut b = good_bytes("g6");
    let (_, _, _, entry) = sections(&b).into_iter().find(|s| s.0 == 2).unwrap();
    b[entry + 8..entry + 16].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    fix_crcs(&mut b);
    let e = open_err("section.flm", &b, LoadMode::Mmap);
    assert!(e.contains("outside the file"), "{e}");
}

#[test]
fn checksum_mismatches() {
    let good = good_bytes("g7");
    // metadata byte flipped, crc not fixed
    let (_, off, _, _) = sections(&good).into_iter().find(|s| s.0 == 1).unwrap();
    let mut b = good.clone();
    b[off + 6] ^= 0x20;
    let e = open_err("metacrc.flm", &b, LoadMode::Mmap);
    assert!(e.contains("checksum mismatch"), "{e}");
    // header byte flipped
    let mut b = good.clone();
    b[28] ^= 1;
    let e = open_err("headcrc.flm", &b, LoadMode::LowMemory);
    assert!(e.contains("checksum"), "{e}");
    // tensor byte flipped: open succeeds, access fails in both modes, verify() fails
    let p = tmp("tensorcrc.flm");
    let f0 = FlmFile::open(tmp("good-g7.flm"), LoadMode::Mmap).unwrap();
    let info = f0.tensor_info("t.q8_0").unwrap().clone();
    let mut b = good.clone();
    b[info.offset as usize + 3] ^= 0x55;
    std::fs::write(&p, &b).unwrap();
    for mode in [LoadMode::Mmap, LoadMode::LowMemory] {
        let f = FlmFile::open(&p, mode).unwrap();
        let e = f.tensor("t.q8_0").unwrap_err().to_string();
        assert!(
            e.contains("checksum mismatch")
                && e.contains("t.q8_0")
                && e.contains(p.to_str().unwrap()),
            "{e}"
        );
        assert!(f.tensor("t.f32").is_ok());
        assert!(f.verify().is_err());
    }
}

#[test]
fn writer_rejects_bad_tensors() {
    let p = tmp("bad-writer.flm");
    let mut w = FlmWriter::create(&p, &config(), &Metadata::new(), &tokenizer()).unwrap();
    assert!(w
        .add_tensor("a", DataType::F32, &[2, 2], &[0u8; 15])
        .is_err());
    assert!(w
        .add_tensor("b", DataType::Q4_0, &[2, 33], &[0u8; 36])
        .is_err());
    w.add_tensor("c", DataType::F32, &[1], &[0u8; 4]).unwrap();
    assert!(w.add_tensor("c", DataType::F32, &[1], &[0u8; 4]).is_err());
    w.finish().unwrap();
    assert_eq!(
        FlmFile::open(&p, LoadMode::Mmap)
            .unwrap()
            .tensor_names()
            .count(),
        1
    );
    // an unfinished writer leaves nothing behind
    let q = tmp("unfinished.flm");
    let mut w = FlmWriter::create(&q, &config(), &Metadata::new(), &tokenizer()).unwrap();
    w.add_tensor("c", DataType::F32, &[1], &[0u8; 4]).unwrap();
    drop(w);
    assert!(!q.exists());
    assert!(!tmp("unfinished.flm.partial").exists());
}

// ---- safetensors ------------------------------------------------------------------------

fn safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    b
}

fn st_err(name: &str, bytes: &[u8]) -> String {
    let p = tmp(name);
    std::fs::write(&p, bytes).unwrap();
    let e = match SafetensorsFile::open(&p) {
        Ok(_) => panic!("{name}: bad safetensors opened"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains(p.to_str().unwrap()), "{e}");
    e
}

#[test]
fn safetensors_good_and_bad_headers() {
    let ok = safetensors(
        r#"{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
        &[0, 0, 128, 63, 0, 0, 0, 64],
    );
    let p = tmp("ok.safetensors");
    std::fs::write(&p, &ok).unwrap();
    let f = SafetensorsFile::open(&p).unwrap();
    let (info, bytes) = f.tensor("w").unwrap();
    assert_eq!(
        (info.dtype, info.dims.clone()),
        (Some(DataType::F32), vec![2])
    );
    assert_eq!(bytes, &[0, 0, 128, 63, 0, 0, 0, 64]);

    let e = st_err("short.safetensors", &[1, 2, 3]);
    assert!(e.contains("truncated"), "{e}");
    let mut huge = ok.clone();
    huge[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(st_err("huge.safetensors", &huge).contains("exceeds the file"));
    assert!(st_err("json.safetensors", &safetensors("{not json", &[])).contains("JSON"));
    let e = st_err(
        "outside.safetensors",
        &safetensors(
            r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}}"#,
            &[0; 8],
        ),
    );
    assert!(e.contains("outside"), "{e}");
    let e = st_err(
        "size.safetensors",
        &safetensors(
            r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            &[0; 8],
        ),
    );
    assert!(e.contains("needs 12 bytes"), "{e}");
    let e = st_err(
        "dtype.safetensors",
        &safetensors(
            r#"{"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}"#,
            &[0; 8],
        ),
    );
    assert!(e.contains("I64"), "{e}");
    let e = st_err(
        "overlap.safetensors",
        &safetensors(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
            &[0; 8],
        ),
    );
    assert!(e.contains("overlap"), "{e}");
    let e = st_err(
        "dims.safetensors",
        &safetensors(
            r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
            &[0; 8],
        ),
    );
    assert!(e.contains("overflow") || e.contains("needs"), "{e}");
}
