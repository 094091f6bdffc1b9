//! `fastllm perplexity`: the command line over `fastllm::generate::perplexity` — reads the text,
//! checks the flags, prints the running value per window and the final `PPL = x ± err` (or one
//! JSON object), and saves or compares KL-divergence base files.

use crate::{load_model, ModelArgs};
use clap::Args;
use fastllm::generate::perplexity::kl::{BaseHeader, BaseReader, BaseWriter, KlStats};
use fastllm::generate::perplexity::{self, NllStats, PerplexityParams, Plan};
use fastllm::{Error, Result};
use std::io::Write;
use std::path::Path;

/// The flags of `fastllm perplexity`.
#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Text file to measure.
    #[arg(short = 'f', long = "file")]
    file: Option<String>,
    /// Tokens per window; the second half of each window is scored.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx: usize,
    /// Windows to evaluate at most (default: every whole window of the text).
    #[arg(long)]
    chunks: Option<usize>,
    /// Tokens per forward call.
    #[arg(short = 'b', long = "batch", default_value_t = 512)]
    batch: usize,
    /// One JSON object on stdout instead of the running values.
    #[arg(long)]
    json: bool,
    /// With --save: write this run's scored log-probabilities to FILE (a base for --kl-divergence).
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    kl_base: Option<String>,
    /// Write the --kl-divergence-base file (replacing it).
    #[arg(long)]
    save: bool,
    /// Compare this run against a base FILE saved by another run on the same text and -c.
    #[arg(long = "kl-divergence", value_name = "FILE")]
    kl: Option<String>,
}

enum KlMode {
    None,
    Save(BaseWriter),
    Compare(BaseReader, KlStats),
}

/// Reads the text file, with a clear error when it is missing or empty.
fn read_text(file: &Option<String>) -> Result<String> {
    let f = file
        .as_deref()
        .ok_or_else(|| Error::invalid("give the text to measure with -f FILE"))?;
    let text = std::fs::read_to_string(f).map_err(|e| Error::io(f, e))?;
    if text.trim().is_empty() {
        return Err(Error::invalid(format!("text file {f} is empty")));
    }
    Ok(text)
}

/// Checks the KL flags' combination before anything loads.
fn check_kl_flags(a: &PerplexityArgs) -> Result<()> {
    match (&a.kl_base, a.save, &a.kl) {
        (Some(_), _, Some(_)) => Err(Error::invalid(
            "give either --kl-divergence-base FILE --save (to write a base) or --kl-divergence \
             FILE (to compare against one), not both",
        )),
        (Some(f), false, None) => Err(Error::invalid(format!(
            "--kl-divergence-base {f} writes a base file: add --save (to compare against an \
             existing one, use --kl-divergence {f})"
        ))),
        (None, true, _) => Err(Error::invalid("--save needs --kl-divergence-base FILE")),
        (None, false, Some(f)) if !Path::new(f).is_file() => Err(Error::invalid(format!(
            "KL-divergence base file {f} does not exist (write one with --kl-divergence-base \
             {f} --save)"
        ))),
        _ => Ok(()),
    }
}

/// Runs `fastllm perplexity`.
pub fn run(a: PerplexityArgs, bars: &mut crate::Bars) -> Result<()> {
    check_kl_flags(&a)?;
    let text = read_text(&a.file)?;
    let params = PerplexityParams {
        n_ctx: a.ctx,
        max_chunks: a.chunks,
        batch: a.batch,
    };
    // flags that need no model are checked before loading it
    params.validate()?;
    let llm = load_model(&a.m, bars)?;
    let (tokens, bos) = perplexity::tokenize(&llm, &text)?;
    let cfg = llm.model.config();
    let plan = Plan::new(tokens.len(), bos, &params, cfg.context_length)?;
    let vocab = cfg.vocab_size;
    let header = BaseHeader::of_run(&plan, &tokens, vocab)?;
    let mut kl = match (&a.kl_base, &a.kl) {
        (Some(f), _) => KlMode::Save(BaseWriter::create(Path::new(f), &header)?),
        (_, Some(f)) => {
            let r = BaseReader::open(Path::new(f))?;
            r.header.check_matches(&header)?;
            KlMode::Compare(r, KlStats::default())
        }
        _ => KlMode::None,
    };
    eprintln!(
        "perplexity: {} tokens, {} windows of {} (BOS {}), scoring {} tokens each",
        tokens.len(),
        plan.chunks,
        plan.n_ctx,
        bos.map_or("none".into(), |b| b.to_string()),
        plan.scored_per_chunk()
    );
    let mut running = Vec::with_capacity(plan.chunks);
    let out = std::io::stdout();
    let stats = perplexity::evaluate(&llm.model, &tokens, &plan, a.batch, &mut |s, st| {
        running.push(st.ppl());
        match &mut kl {
            KlMode::Save(w) => w.write_chunk(s)?,
            KlMode::Compare(r, acc) => r.compare_chunk(s, acc)?,
            KlMode::None => {}
        }
        if !a.json {
            let mut o = out.lock();
            let _ = write!(o, "[{}]{:.4},", s.chunk + 1, st.ppl());
            let _ = o.flush();
        }
        Ok(())
    })?;
    let kl_stats = match kl {
        KlMode::Save(w) => {
            w.finish()?;
            None
        }
        KlMode::Compare(_, acc) => Some(acc),
        KlMode::None => None,
    };
    if a.json {
        println!(
            "{}",
            json_report(&plan, tokens.len(), &stats, &running, &kl_stats)
        );
    } else {
        println!();
        print_report(&stats, &kl_stats);
    }
    if let (Some(f), true) = (&a.kl_base, a.save) {
        eprintln!("perplexity: saved the base log-probabilities to {f}");
    }
    Ok(())
}

fn pm(v: Option<f64>, digits: usize) -> String {
    v.map_or("n/a".into(), |e| format!("{e:.digits$}"))
}

fn print_report(stats: &NllStats, kl: &Option<KlStats>) {
    println!("PPL = {:.4} ± {}", stats.ppl(), pm(stats.ppl_err(), 5));
    if let Some(k) = kl {
        println!(
            "PPL(base) = {:.4} ± {}",
            k.base.ppl(),
            pm(k.base.ppl_err(), 5)
        );
        println!("Mean KLD = {:.6} ± {}", k.mean_kld(), pm(k.kld_err(), 6));
        println!(
            "Same top token = {:.3} ± {} %",
            100.0 * k.top1(),
            pm(k.top1_err().map(|e| 100.0 * e), 3)
        );
    }
}

fn json_report(
    plan: &Plan,
    n_tokens: usize,
    stats: &NllStats,
    running: &[f64],
    kl: &Option<KlStats>,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "ppl": stats.ppl(),
        "ppl_err": stats.ppl_err(),
        "mean_nll": stats.mean(),
        "n_ctx": plan.n_ctx,
        "chunks": plan.chunks,
        "tokens": n_tokens,
        "scored": stats.count,
        "running_ppl": running,
    });
    if let Some(k) = kl {
        v["kl_divergence"] = serde_json::json!({
            "ppl_base": k.base.ppl(),
            "ppl_base_err": k.base.ppl_err(),
            "mean_kld": k.mean_kld(),
            "mean_kld_err": k.kld_err(),
            "same_top": k.top1(),
            "same_top_err": k.top1_err(),
            "rows": k.count,
        });
    }
    v
}
