//! `convert-weights`: converts a Hugging Face model directory or a GGUF file into `.flm`
//! (`convert-weights INPUT -o OUT.flm [--dtype ...]`), or prints a `.flm` / GGUF file's metadata,
//! tokenizer summary and tensor table (`convert-weights --info FILE`). Errors are one line on
//! stderr and a non-zero exit code.

mod progress;

use clap::Parser;
use fastllm::convert::{convert, ConvertOptions, TargetDtype};
use fastllm::{Error, Result};
use std::path::PathBuf;
use std::process::ExitCode;

/// Command-line arguments.
#[derive(Parser, Debug)]
#[command(name = "convert-weights", version, about)]
struct Args {
    /// Hugging Face model directory or GGUF file (with --info: a .flm or GGUF file).
    input: PathBuf,
    /// Output .flm file.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Weight dtype: f32, f16, bf16, int8, int4, int4-min, keep, lossless, or one of llama.cpp's
    /// mixes q4_k_m, q5_k_m, q6_k, q8_0, q4_0 (from an f32/f16/bf16 source).
    #[arg(long, default_value = "keep")]
    dtype: String,
    /// Print the file's metadata, tokenizer summary and tensor table instead of converting.
    #[arg(long)]
    info: bool,
}

fn run(args: &Args) -> Result<()> {
    if args.info {
        return fastllm::format::info::describe(&args.input).map(|s| print!("{s}"));
    }
    let out = args
        .output
        .as_ref()
        .ok_or_else(|| Error::invalid("missing -o OUT.flm"))?;
    let dtype = TargetDtype::parse(&args.dtype)?;
    let opts = ConvertOptions { dtype };
    let mut bar = progress::Reporter::new();
    let report = convert(&args.input, out, &opts, &mut |p| bar.update(p))?;
    bar.finish();
    println!(
        "{}: {} tensors, {} bytes of weights ({}), written to {}",
        report.architecture,
        report.tensors,
        report.tensor_bytes,
        dtype.name(),
        out.display()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = e.to_string().replace('\n', " ");
            eprintln!("convert-weights: {msg}");
            ExitCode::FAILURE
        }
    }
}
