//! Sessions, generation and the paged batch path on a tiny converted fixture model: eval/sample/
//! reset, context overflow, seeds, stop strings, multi-turn chat, NaN logits, low-memory mode,
//! and batched paged forward equal to one-sequence forward.

use fastllm::convert::convert;
use fastllm::data::{Data, DataType};
use fastllm::generate::{GenerateParams, Llm, SamplingParams, Session, StopReason};
use fastllm::load::{load, LoadOptions};
use fastllm::model::{MapSource, Model, PagedKvPool, PagedSeqState, Precision};
use fastllm::Executor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn tiny(arch: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-gen-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let out = d.join(format!("{arch}.flm"));
    if !out.exists() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/fixtures/tiny")
            .join(arch);
        convert(&dir, &out, &Default::default(), &mut |_| {}).unwrap();
    }
    out
}

fn llm(arch: &str, low_memory: bool) -> Arc<Llm> {
    Arc::new(
        load(
            &tiny(arch),
            &LoadOptions {
                threads: 2,
                low_memory,
                ..Default::default()
            },
        )
        .unwrap(),
    )
}

#[test]
fn eval_sample_reset_and_errors() {
    let m = llm("qwen2", false);
    let mut s = Session::new(m.clone(), 16).unwrap();
    assert!(s.eval(&[]).is_err());
    assert!(s.eval(&[600]).is_err(), "id beyond the vocabulary");
    assert_eq!(s.len(), 0);
    let l = s.eval(&[1, 2, 3]).unwrap().to_vec();
    assert_eq!(l.len(), 512);
    let e = s.eval(&[5; 14]).unwrap_err().to_string();
    assert!(e.contains("context full"), "{e}");
    assert_eq!(s.len(), 3, "a refused eval leaves the session unchanged");
    // the incremental logits equal a one-shot forward of the same tokens
    s.eval(&[4, 5]).unwrap();
    let mut c = m.model.new_cache(8).unwrap();
    let all = m
        .model
        .forward(&mut c, &[1, 2, 3, 4, 5], false)
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let inc = s.logits();
    let worst = all
        .iter()
        .zip(inc)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "incremental decode differs by {worst}");
    s.reset().unwrap();
    assert!(s.is_empty() && s.logits().is_empty());
}

#[test]
fn seeds_stops_and_chat() {
    let m = llm("qwen2", false);
    let p = |seed| GenerateParams {
        max_new_tokens: 12,
        sampling: SamplingParams {
            temperature: 1.0,
            top_k: 50,
            seed,
            ..Default::default()
        },
        ..Default::default()
    };
    let gen = |params: &GenerateParams| {
        let mut s = Session::new(m.clone(), 0).unwrap();
        s.generate("Hello there", params, &mut |_, _| true).unwrap()
    };
    let (a, b, c) = (gen(&p(7)), gen(&p(7)), gen(&p(8)));
    assert_eq!(a.tokens, b.tokens, "same seed, same tokens");
    assert_ne!(a.tokens, c.tokens, "another seed, other tokens");
    // stop strings cut the text and are not included; pieces streamed equal the text
    let greedy = gen(&GenerateParams {
        max_new_tokens: 12,
        ..Default::default()
    });
    if greedy.text.chars().count() > 4 {
        let stop: String = greedy.text.chars().skip(2).take(2).collect();
        let mut streamed = String::new();
        let mut s = Session::new(m.clone(), 0).unwrap();
        let g = s
            .generate(
                "Hello there",
                &GenerateParams {
                    max_new_tokens: 12,
                    stop: vec![stop.clone()],
                    ..Default::default()
                },
                &mut |_, t| {
                    streamed.push_str(t);
                    true
                },
            )
            .unwrap();
        assert_eq!(g.stop_reason, StopReason::StopString);
        assert!(!g.text.contains(&stop));
        assert!(greedy.text.starts_with(&g.text));
        assert_eq!(streamed, g.text);
    }
    // cancellation from the callback
    let mut s = Session::new(m.clone(), 0).unwrap();
    let mut n = 0;
    let g = s.generate(
        "Hello",
        &GenerateParams {
            max_new_tokens: 20,
            ..Default::default()
        },
        &mut |_, _| {
            n += 1;
            n < 3
        },
    );
    assert_eq!(g.unwrap().stop_reason, StopReason::Cancelled);
    // empty prompt
    let mut s = Session::new(m.clone(), 0).unwrap();
    assert!(s
        .generate("", &GenerateParams::default(), &mut |_, _| true)
        .is_err());
    // chat: the second turn reuses the cached prefix
    let chat = GenerateParams {
        max_new_tokens: 4,
        chat: true,
        system: Some("Be brief.".into()),
        ..Default::default()
    };
    let g1 = s.generate("Hi", &chat, &mut |_, _| true).unwrap();
    let g2 = s.generate("Again", &chat, &mut |_, _| true).unwrap();
    let rendered = m
        .render_chat(&[fastllm::generate::ChatMessage::new("user", "x")], true)
        .unwrap();
    assert!(rendered.contains("x"));
    assert!(
        g2.prompt_tokens < s.len(),
        "second turn evaluated {} of {} tokens",
        g2.prompt_tokens,
        s.len()
    );
    assert!(g1.prompt_tokens > 0);
}

#[test]
fn low_memory_mode_gives_the_same_logits() {
    let (a, b) = (llm("llama", false), llm("llama", true));
    let ids = [1u32, 50, 60, 70, 80];
    let la = a
        .model
        .forward(&mut a.model.new_cache(8).unwrap(), &ids, true)
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let lb = b
        .model
        .forward(&mut b.model.new_cache(8).unwrap(), &ids, true)
        .unwrap()
        .to_f32_vec()
        .unwrap();
    assert_eq!(la, lb);
}

#[test]
fn nan_weights_are_an_error_not_a_token() {
    let m = llm("qwen2", false);
    // rebuild the same model from memory with a poisoned final norm
    let f =
        fastllm::format::flm::FlmFile::open(tiny("qwen2"), fastllm::format::flm::LoadMode::Mmap)
            .unwrap();
    let mut src = MapSource::new();
    for n in f.tensor_names() {
        let mut d = f.tensor(n).unwrap().to_owned_host().unwrap();
        if n == "model.norm.weight" {
            d = Data::from_f32(d.dims(), &vec![f32::NAN; d.count()]).unwrap();
        }
        src.insert(n, d);
    }
    let model = Model::new(
        m.model.config().clone(),
        Arc::new(src),
        Executor::cpu(1).unwrap(),
        Precision::Exact,
        false,
    )
    .unwrap();
    let tokenizer = fastllm::tokenizer::Tokenizer::new(f.tokenizer_spec().clone()).unwrap();
    let bad = Arc::new(Llm {
        model,
        tokenizer,
        chat_template: m.chat_template.clone(),
        name: "poisoned".into(),
    });
    // the greedy paged step checks host logits as the sampler does
    let mut pool = PagedKvPool::new(&bad.model, 4, 4).unwrap();
    let mut st = PagedSeqState::new();
    let e = bad
        .model
        .forward_paged_greedy(&mut pool, &mut [(&mut st, &[1u32, 2][..])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("NaN"), "{e}");
    assert_eq!(st.len(), 0);
    let mut s = Session::new(bad, 0).unwrap();
    let e = s.eval(&[1, 2]).unwrap_err().to_string();
    assert!(e.contains("NaN"), "{e}");
    assert_eq!(s.len(), 0);
    assert_eq!(DataType::F32.name(), "f32");
}

#[test]
fn paged_batch_equals_single_sequence_forward() {
    for arch in ["llama", "gemma2", "bloom", "qwen3"] {
        let m = llm(arch, false);
        let seqs: [&[u32]; 3] = [
            &[1, 20, 30, 40, 50, 60, 70],
            &[2, 9],
            &[
                3, 33, 44, 55, 66, 77, 88, 99, 111, 122, 133, 144, 155, 166, 177, 188, 199, 210,
            ],
        ];
        // reference: each sequence alone, prompt then one decode step
        let mut want = Vec::new();
        for s in seqs {
            let mut c = m.model.new_cache(64).unwrap();
            let l1 = m
                .model
                .forward(&mut c, &s[..s.len() - 1], false)
                .unwrap()
                .to_f32_vec()
                .unwrap();
            let l2 = m
                .model
                .forward(&mut c, &s[s.len() - 1..], false)
                .unwrap()
                .to_f32_vec()
                .unwrap();
            want.push((l1, l2));
        }
        let mut pool = PagedKvPool::new(&m.model, 8, 4).unwrap();
        let mut st: Vec<PagedSeqState> = (0..3).map(|_| PagedSeqState::new()).collect();
        // step 1: all prompts (minus the last token) together
        let (a, rest) = st.split_at_mut(1);
        let (b, c) = rest.split_at_mut(1);
        let mut batch = vec![
            (&mut a[0], &seqs[0][..seqs[0].len() - 1]),
            (&mut b[0], &seqs[1][..seqs[1].len() - 1]),
            (&mut c[0], &seqs[2][..seqs[2].len() - 1]),
        ];
        let l = m.model.forward_paged(&mut pool, &mut batch).unwrap();
        // step 2: one decode token each
        let mut batch2 = vec![
            (&mut a[0], &seqs[0][seqs[0].len() - 1..]),
            (&mut b[0], &seqs[1][seqs[1].len() - 1..]),
            (&mut c[0], &seqs[2][seqs[2].len() - 1..]),
        ];
        let l2 = m.model.forward_paged(&mut pool, &mut batch2).unwrap();
        for i in 0..3 {
            for (got, exp) in [(&l[i], &want[i].0), (&l2[i], &want[i].1)] {
                let worst = got
                    .iter()
                    .zip(exp.iter())
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, f32::max);
                assert!(
                    worst < 1e-4,
                    "{arch} sequence {i}: paged differs by {worst}"
                );
            }
        }
        // pool accounting: blocks come back
        let used = pool.total_blocks() - pool.free_blocks();
        assert_eq!(used, st.iter().map(|s| s.blocks().len()).sum::<usize>());
        for s in st.iter_mut() {
            pool.release(s);
        }
        assert_eq!(pool.free_blocks(), pool.total_blocks());
        // exhaustion is an error that changes nothing
        let mut big = PagedSeqState::new();
        let long: Vec<u32> = (1..100).collect();
        let e = m
            .model
            .forward_paged(&mut pool, &mut [(&mut big, &long[..])])
            .unwrap_err()
            .to_string();
        assert!(e.contains("blocks"), "{e}");
        assert_eq!(pool.free_blocks(), pool.total_blocks());
    }
}

/// Logits after the last token of `toks`, computed alone in a contiguous cache.
fn last_logits(m: &Llm, toks: &[u32]) -> Vec<f32> {
    let mut c = m.model.new_cache(64).unwrap();
    m.model
        .forward(&mut c, toks, false)
        .unwrap()
        .to_f32_vec()
        .unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn paged_prefix_cache_reuses_only_identical_full_blocks() {
    for arch in ["llama", "qwen3"] {
        let m = llm(arch, false);
        let mut pool = PagedKvPool::new(&m.model, 16, 4).unwrap();
        pool.set_prefix_caching(true);
        let a: Vec<u32> = (0..13).map(|i| 5 + i * 11).collect();
        // A alone: 3 full blocks registered, cached after release
        let mut st = PagedSeqState::new();
        assert_eq!(pool.match_prefix(&mut st, &a), 0);
        let l = m
            .model
            .forward_paged(&mut pool, &mut [(&mut st, &a[..])])
            .unwrap();
        assert!(max_diff(&l[0], &last_logits(&m, &a)) < 1e-4);
        pool.release(&mut st);
        assert_eq!(pool.cached_blocks(), 3);
        assert_eq!(pool.free_blocks(), 16);
        // B: A's first 10 tokens then others; C: same first block only; D: differs at once;
        // E: exactly A's first 8 (the last token is always computed: 1 block)
        let mut b = a[..10].to_vec();
        b.extend([200, 201, 202]);
        let mut c = a[..6].to_vec();
        c.extend([7, 8, 9, 10, 11]);
        let mut d = a.clone();
        d[0] = 6;
        let e = a[..8].to_vec();
        let cases: [(&[u32], usize); 5] = [(&b, 8), (&c, 4), (&d, 0), (&e, 4), (&a, 12)];
        let mut states: Vec<PagedSeqState> = (0..5).map(|_| PagedSeqState::new()).collect();
        for ((toks, hit), st) in cases.iter().zip(states.iter_mut()) {
            assert_eq!(pool.match_prefix(st, toks), *hit, "{arch} {toks:?}");
            assert_eq!(st.len(), *hit);
        }
        // all five at once, sharing cached blocks: each equals its own computation
        {
            let mut batch: Vec<(&mut PagedSeqState, &[u32])> = states
                .iter_mut()
                .zip(cases.iter())
                .map(|(st, (toks, hit))| (st, &toks[*hit..]))
                .collect();
            let l = m.model.forward_paged(&mut pool, &mut batch).unwrap();
            for ((toks, _), got) in cases.iter().zip(&l) {
                let worst = max_diff(got, &last_logits(&m, toks));
                assert!(worst < 1e-4, "{arch} {toks:?}: differs by {worst}");
            }
        }
        for st in states.iter_mut() {
            pool.release(st);
        }
        assert_eq!(pool.free_blocks(), 16);
        // a long sequence needs every block: cached ones are evicted, nothing stale matches
        let long: Vec<u32> = (0..64).map(|i| 300 + i).collect();
        let mut big = PagedSeqState::new();
        m.model
            .forward_paged(&mut pool, &mut [(&mut big, &long[..])])
            .unwrap();
        assert_eq!(pool.free_blocks(), 0);
        pool.release(&mut big);
        let mut again = PagedSeqState::new();
        assert_eq!(pool.match_prefix(&mut again, &a), 0);
        assert_eq!(pool.match_prefix(&mut again, &long[..44]), 40);
        pool.release(&mut again);
        // switching caching off frees every cached block
        pool.set_prefix_caching(false);
        assert_eq!(pool.cached_blocks(), 0);
        assert_eq!(pool.free_blocks(), 16);
    }
}

/// `forward_paged_greedy` picks exactly the argmax of `forward_paged`'s rows, step after step
/// (prompt chunks of different lengths, then decode tokens), and leaves the pool the same.
#[test]
fn paged_greedy_equals_argmax_of_paged_logits() {
    for arch in ["llama", "qwen3", "gemma2"] {
        let m = llm(arch, false);
        let prompts: [&[u32]; 3] = [&[1, 20, 30, 40, 50], &[2, 9], &[3, 33, 44, 55, 66, 77, 88]];
        let mut pa = PagedKvPool::new(&m.model, 16, 4).unwrap();
        let mut pb = PagedKvPool::new(&m.model, 16, 4).unwrap();
        let mut sa: Vec<PagedSeqState> = (0..3).map(|_| PagedSeqState::new()).collect();
        let mut sb: Vec<PagedSeqState> = (0..3).map(|_| PagedSeqState::new()).collect();
        let mut next: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
        for step in 0..4 {
            let want: Vec<u32> = {
                let mut batch: Vec<(&mut PagedSeqState, &[u32])> =
                    sa.iter_mut().zip(&next).map(|(s, t)| (s, &t[..])).collect();
                let rows = m.model.forward_paged(&mut pa, &mut batch).unwrap();
                rows.iter()
                    .map(|r| fastllm::generate::sampler::argmax(r))
                    .collect()
            };
            let got = {
                let mut batch: Vec<(&mut PagedSeqState, &[u32])> =
                    sb.iter_mut().zip(&next).map(|(s, t)| (s, &t[..])).collect();
                m.model.forward_paged_greedy(&mut pb, &mut batch).unwrap()
            };
            assert_eq!(got, want, "{arch} step {step}");
            assert_eq!(pa.free_blocks(), pb.free_blocks(), "{arch} step {step}");
            next = got.iter().map(|&t| vec![t]).collect();
        }
    }
}
