//! Sessions, generation and the paged batch path on a tiny converted fixture model: eval/sample/
//! reset, context overflow, seeds, stop strings, multi-turn chat, NaN logits, low-memory mode,
//! and batched paged forward equal to one-sequence forward.

mod common;

use fastllm::convert::convert;
use fastllm::data::{Data, DataType};
use fastllm::generate::{GenerateParams, Llm, SamplingParams, Session, StopReason};
use fastllm::load::{load, LoadOptions};
use fastllm::model::{MapSource, Model, PagedKvPool, PagedSeqState, Precision};
use fastllm::Executor;
use std::path::PathBuf;
use std::sync::Arc;

fn tiny(arch: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastllm-gen-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let out = d.join(format!("{arch}.flm"));
    if !out.exists() {
        let dir = common::tiny_fixture(arch);
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
fn chunked_prefill_reports_progress_and_equals_one_step() {
    use fastllm::progress::{Progress, Stage};
    let m = llm("qwen2", false);
    let prompt: Vec<u32> = (0..23).map(|i| (i * 37 + 5) % 500).collect();
    let mut one = Session::new(m.clone(), 32).unwrap();
    let want = one.eval(&prompt).unwrap().to_vec();
    let mut s = Session::new(m.clone(), 32).unwrap();
    let mut seen = Vec::new();
    let got = s
        .eval_chunked(&prompt, 5, &mut |p: &Progress| {
            assert_eq!((p.stage, p.total), (Stage::Prefill, 23));
            seen.push(p.done);
        })
        .unwrap()
        .to_vec();
    assert_eq!(seen, [0, 5, 10, 15, 20, 23]);
    assert!(max_diff(&want, &got) < 1e-3, "{}", max_diff(&want, &got));
    assert_eq!(s.tokens(), &prompt[..]);
    // a chunk that fails (an id beyond the vocabulary in the third) leaves the tokens as before
    let mut bad = prompt.clone();
    bad[12] = 600;
    let mut s = Session::new(m.clone(), 64).unwrap();
    s.eval(&[1, 2]).unwrap();
    assert!(s.eval_chunked(&bad, 5, &mut |_: &Progress| {}).is_err());
    assert_eq!(s.tokens(), &[1, 2]);
    let next = s.eval(&[3]).unwrap().to_vec();
    let mut fresh = Session::new(m.clone(), 64).unwrap();
    assert!(max_diff(&next, fresh.eval(&[1, 2, 3]).unwrap()) < 1e-4);
    // too long for the context: refused before any chunk runs
    let mut s = Session::new(m, 16).unwrap();
    let mut calls = 0;
    let e = s.eval_chunked(&prompt, 5, &mut |_: &Progress| calls += 1);
    assert!(e.unwrap_err().to_string().contains("context full"));
    assert_eq!((calls, s.len()), (0, 0));
}

#[test]
fn load_reports_the_weights_prepared() {
    use fastllm::progress::{Progress, Stage};
    let mut seen = Vec::new();
    let opts = LoadOptions {
        threads: 2,
        ..Default::default()
    };
    fastllm::load::load_with(&tiny("qwen2"), &opts, &mut |p: &Progress| {
        assert_eq!(p.stage, Stage::Load);
        seen.push((p.done, p.total));
    })
    .unwrap();
    let total = seen[0].1;
    assert!(total > 0 && seen[0].0 == 0, "{seen:?}");
    assert_eq!(seen.last(), Some(&(total, total)), "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0 && w[1].1 == total));
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
    // GPT-OSS: its sinks, router bias and split experts (with biases) read from the file too
    for arch in ["llama", "deepseek_v3", "gpt_oss"] {
        let (a, b) = (llm(arch, false), llm(arch, true));
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
        assert_eq!(la, lb, "{arch}");
    }
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

/// A paged batch of sequences of different reach equals each sequence alone, with rotations
/// that depend on the length a sequence reaches in the step (LongRoPE: one sequence past its
/// original context of 32, one within it), with Gemma-3's two bases, and with GPT-OSS's sinks
/// and sliding window (8) on the 40-token sequence.
#[test]
fn paged_batch_with_length_dependent_rope_equals_single_sequences() {
    for arch in ["phi3-longrope", "gemma3", "gpt_oss"] {
        let m = llm(arch, false);
        let long: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 500).collect();
        let short: Vec<u32> = vec![5, 17, 29, 41];
        let alone = |s: &[u32]| {
            let mut c = m.model.new_cache(64).unwrap();
            m.model
                .forward(&mut c, s, false)
                .unwrap()
                .to_f32_vec()
                .unwrap()
        };
        let want = [alone(&long), alone(&short)];
        let mut pool = PagedKvPool::new(&m.model, 16, 8).unwrap();
        let (mut a, mut b) = (PagedSeqState::new(), PagedSeqState::new());
        let mut batch = vec![(&mut a, &long[..]), (&mut b, &short[..])];
        let got = m.model.forward_paged(&mut pool, &mut batch).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let worst = g
                .iter()
                .zip(w)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(
                worst < 1e-4,
                "{arch} sequence {i}: paged differs by {worst}"
            );
        }
    }
}

#[test]
fn paged_batch_equals_single_sequence_forward() {
    for arch in [
        "llama",
        "gemma2",
        "bloom",
        "qwen3",
        "deepseek_v3",
        "gpt_oss",
    ] {
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

fn sampling_sets() -> Vec<SamplingParams> {
    vec![
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            seed: 11,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.3,
            top_k: 7,
            min_p: 0.02,
            seed: 12,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.9,
            repetition_penalty: 1.3,
            presence_penalty: 0.4,
            frequency_penalty: 0.2,
            seed: 13,
            ..Default::default()
        },
        SamplingParams {
            repetition_penalty: 1.5,
            ..Default::default()
        },
    ]
}

/// `forward_paged_sample` picks exactly what the host sampler picks from `forward_paged`'s rows
/// with the same seeds, step after step, greedy and sampled rows (with penalties) mixed in one
/// batch; a wrong number of rows is an error.
#[test]
fn paged_sample_equals_host_sampler_on_paged_logits() {
    use fastllm::generate::Sampler;
    for arch in ["llama", "qwen3"] {
        let m = llm(arch, false);
        let sets = sampling_sets();
        let prompts: Vec<Vec<u32>> = (0..sets.len() as u32)
            .map(|i| (0..3 + i).map(|k| 1 + (i * 37 + k * 11) % 400).collect())
            .collect();
        let n = sets.len();
        let mut pa = PagedKvPool::new(&m.model, 32, 4).unwrap();
        let mut pb = PagedKvPool::new(&m.model, 32, 4).unwrap();
        let mut sa: Vec<PagedSeqState> = (0..n).map(|_| PagedSeqState::new()).collect();
        let mut sb: Vec<PagedSeqState> = (0..n).map(|_| PagedSeqState::new()).collect();
        let mut ha: Vec<Sampler> = sets
            .iter()
            .map(|p| Sampler::new(p.clone()).unwrap())
            .collect();
        let mut hb: Vec<Sampler> = sets
            .iter()
            .map(|p| Sampler::new(p.clone()).unwrap())
            .collect();
        let mut hist: Vec<Vec<u32>> = prompts.clone();
        let mut next: Vec<Vec<u32>> = prompts.clone();
        for step in 0..6 {
            let want: Vec<u32> = {
                let mut batch: Vec<(&mut PagedSeqState, &[u32])> =
                    sa.iter_mut().zip(&next).map(|(s, t)| (s, &t[..])).collect();
                let rows = m.model.forward_paged(&mut pa, &mut batch).unwrap();
                rows.iter()
                    .zip(ha.iter_mut())
                    .zip(&hist)
                    .map(|((r, s), h)| s.sample(r, h).unwrap())
                    .collect()
            };
            let got = {
                let rows: Vec<_> = hb
                    .iter_mut()
                    .zip(&hist)
                    .map(|(s, h)| s.next_row(h))
                    .collect();
                let mut batch: Vec<(&mut PagedSeqState, &[u32])> =
                    sb.iter_mut().zip(&next).map(|(s, t)| (s, &t[..])).collect();
                assert!(m
                    .model
                    .forward_paged_sample(&mut pb, &mut batch, &rows[..1])
                    .is_err());
                m.model
                    .forward_paged_sample(&mut pb, &mut batch, &rows)
                    .unwrap()
            };
            assert_eq!(got, want, "{arch} step {step}");
            assert_eq!(pa.free_blocks(), pb.free_blocks(), "{arch} step {step}");
            for (h, &t) in hist.iter_mut().zip(&got) {
                h.push(t);
            }
            next = got.iter().map(|&t| vec![t]).collect();
        }
    }
}

/// `Session::generate` (which runs each step and its pick together, where the logits are)
/// gives the tokens of the plain loop of `eval` and `Sampler::sample` on host logits.
#[test]
fn generate_equals_eval_and_host_sampling() {
    use fastllm::generate::Sampler;
    let m = llm("llama", false);
    for params in sampling_sets() {
        let gp = GenerateParams {
            max_new_tokens: 10,
            sampling: params.clone(),
            ..Default::default()
        };
        let mut s = Session::new(m.clone(), 0).unwrap();
        let g = s.generate("Hello there", &gp, &mut |_, _| true).unwrap();
        // after generate, logits() still gives the last step's logits
        assert_eq!(s.logits().len(), 512);
        let mut h = Session::new(m.clone(), 0).unwrap();
        let prompt = m.tokenizer.encode("Hello there", true, false).unwrap();
        h.eval(&prompt).unwrap();
        let mut smp = Sampler::new(params.clone()).unwrap();
        let eos = m.eos_ids();
        let mut toks = Vec::new();
        for i in 0..10 {
            let t = h.sample(&mut smp).unwrap();
            if eos.contains(&t) {
                break;
            }
            toks.push(t);
            if i + 1 < 10 {
                h.eval(&[t]).unwrap();
            }
        }
        assert_eq!(g.tokens, toks, "{params:?}");
    }
}

/// The `Sample` and `ApplyPenalties` ops through an executor: top-k 1 and temperature 0 are the
/// argmax, top-p keeps only the nucleus, the same random word gives the same token, bad rows
/// give -1, and the ops equal the host sampler.
#[test]
fn sample_ops_select_as_specified() {
    use fastllm::generate::{sample_logits, Penalties, SampleRow};
    use fastllm::{DataDict, FloatDict, IntDict};
    let e = Executor::cpu(2).unwrap();
    let run = |x: &[f32], n: usize, rows: &[(f32, f32, f32, f32, u64)]| -> Vec<i32> {
        let r = rows.len();
        let x = Data::from_f32(&[r, n], x).unwrap();
        let p: Vec<f32> = rows.iter().flat_map(|q| [q.0, q.1, q.2, q.3]).collect();
        let w: Vec<i32> = rows
            .iter()
            .flat_map(|q| [q.4 as u32 as i32, (q.4 >> 32) as u32 as i32])
            .collect();
        let p = Data::from_f32(&[r, 4], &p).unwrap();
        let w = Data::from_i32(&[r, 2], &w).unwrap();
        let mut out = Data::empty(DataType::I32);
        let mut d = DataDict::new()
            .with("input", &x)
            .with("params", &p)
            .with("random", &w)
            .with_mut("output", &mut out);
        e.run("Sample", &mut d, &FloatDict::new(), &IntDict::new())
            .unwrap();
        out.as_i32().unwrap().to_vec()
    };
    let n = 1000;
    let mut x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 250.0).collect();
    x[123] = 9.0; // a clear best
    let argmax = 123;
    for s in 0..20u64 {
        let w = s.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        assert_eq!(run(&x, n, &[(1.0, 1.0, 1.0, 0.0, w)]), [argmax]);
        assert_eq!(run(&x, n, &[(0.0, 0.0, 1.0, 0.0, w)]), [argmax]);
        // nucleus of 0.5 at temperature 0.5: 9.0 holds far more than half the mass
        assert_eq!(run(&x, n, &[(0.5, 0.0, 0.5, 0.0, w)]), [argmax]);
        // top-k 3 of a row whose three best are known
        let mut y = x.clone();
        y[5] = 8.9;
        y[6] = 8.8;
        let t = run(&y, n, &[(3.0, 3.0, 1.0, 0.0, w)])[0];
        assert!([123, 5, 6].contains(&t), "{t}");
        // determinism: same word, same token; rows are independent
        let yy = [y.clone(), y.clone()].concat();
        let a = run(&yy, n, &[(5.0, 0.0, 1.0, 0.0, w), (5.0, 0.0, 1.0, 0.0, w)]);
        assert_eq!(a[0], a[1]);
        let row = SampleRow {
            temperature: 5.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            random: w,
            penalties: None,
            mask: None,
        };
        assert_eq!(sample_logits(&y, &row).unwrap() as i32, a[0]);
    }
    let mut bad = x.clone();
    bad[3] = f32::NAN;
    assert_eq!(run(&bad, n, &[(1.0, 0.0, 1.0, 0.0, 1)]), [-1]);
    assert!(sample_logits(&bad, &SampleRow::greedy())
        .unwrap_err()
        .to_string()
        .contains("NaN"));
    // ApplyPenalties in place equals the host sampler's penalties
    let mut l = Data::from_f32(&[1, n], &x).unwrap();
    let toks = Data::from_i32(&[1, 2], &[123, 7]).unwrap();
    let counts = Data::from_i32(&[1, 2], &[3, 1]).unwrap();
    let pp = Data::from_f32(&[1, 3], &[2.0, 0.5, 1.0]).unwrap();
    let mut d = DataDict::new()
        .with_mut("input", &mut l)
        .with("tokens", &toks)
        .with("counts", &counts)
        .with("params", &pp);
    e.run("ApplyPenalties", &mut d, &FloatDict::new(), &IntDict::new())
        .unwrap();
    let l = l.to_f32_vec().unwrap();
    assert_eq!(l[123], 9.0 / 2.0 - (0.5 + 3.0));
    assert_eq!(l[7], x[7] / 2.0 - 1.5);
    let row = SampleRow {
        penalties: Some(Penalties {
            repetition: 2.0,
            presence: 0.5,
            frequency: 1.0,
            tokens: vec![(7, 1), (123, 3)],
        }),
        ..SampleRow::greedy()
    };
    let want = fastllm::generate::sampler::argmax(&l);
    assert_eq!(sample_logits(&x, &row).unwrap(), want);
}
